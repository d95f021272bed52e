"""Rule-based verifiers with verl's ``compute_score`` signature, plus the built-in task dispatch.

Every scorer here is ``f(data_source, solution_str, ground_truth, extra_info) -> float`` and
returns 1.0 for a correct answer, 0.0 otherwise. ``solution_str`` is the decoded response
(special tokens skipped); a leaked end marker is cut off before comparing.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from rlctl.data.tasks import strip_answer, task_for_source
from rlctl.rewards.answers import equivalent, final_answer, ground_truth_answer

_NUMBER = re.compile(r"[-+]?(?:\d+(?:,\d{3})*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def exact_match(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 iff the trimmed response equals the ground truth text exactly."""
    return float(strip_answer(solution_str) == str(ground_truth).strip())


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (thousands separators allowed), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def _last_decimal(text: str) -> Decimal | None:
    """The last number written in ``text``, exactly (any size), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return Decimal(found[-1].replace(",", ""))
    except InvalidOperation:
        return None


def _truth_decimal(ground_truth: Any) -> Decimal | None:
    if isinstance(ground_truth, bool):
        return None
    if isinstance(ground_truth, (int, float)):
        return Decimal(ground_truth) if math.isfinite(ground_truth) else None
    return _last_decimal(str(ground_truth))


def numeric_match(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, rel_tol: float = 1e-6
) -> float:
    """1.0 iff the last number in the response equals the numeric ground truth.

    An integer ground truth (``42``, ``"1,000,000"``, ``42.0``) is compared exactly (1000001 is not
    1000000, nor is 1000000.5); a fractional one within ``rel_tol`` (it may be a rounded value).
    """
    got, want = _last_decimal(strip_answer(solution_str)), _truth_decimal(ground_truth)
    if got is None or want is None:
        return 0.0
    try:
        if want == want.to_integral_value():
            return float(got == want)
        return float(math.isclose(float(got), float(want), rel_tol=rel_tol, abs_tol=1e-12))
    except (InvalidOperation, OverflowError):  # an exponent beyond the decimal context: not this number
        return 0.0


def math_match(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 iff the response's final answer equals the ground truth's by value (math-verify), else 0.0.

    The final answer is the last ``\\boxed{...}``, else the line after the last ``####``, else the
    last number (``rlctl.rewards.answers.final_answer``): a number or expression restated from
    the prompt elsewhere in the response is never compared.
    """
    pred = final_answer(strip_answer(solution_str))
    return float(equivalent(pred, ground_truth_answer(ground_truth)))


def builtin_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """The verifier of the built-in task named by ``data_source`` (``rlctl/<task>``)."""
    task = task_for_source(data_source)
    if task is None:
        raise KeyError(f"no built-in verifier for data_source {data_source!r}")
    return task.verify(solution_str, ground_truth)


VERIFIERS = {
    "builtin": builtin_score,
    "exact": exact_match,
    "numeric": numeric_match,
    "math": math_match,
}


def load_verifier(name: str) -> Any:
    """The verifier named ``name`` (a picklable loader for scorer processes)."""
    return VERIFIERS[name]
