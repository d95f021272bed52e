"""Rule-based verifiers with verl's ``compute_score`` signature, plus the built-in task dispatch.

Every scorer here is ``f(data_source, solution_str, ground_truth, extra_info) -> float`` and
returns 1.0 for a correct answer, 0.0 otherwise. ``solution_str`` is the decoded response
(special tokens skipped); a leaked end marker is cut off before comparing.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from typing import Any

from rlctl.data.tasks import strip_answer, task_for_source

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


def numeric_match(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, rel_tol: float = 1e-6
) -> float:
    """1.0 iff the last number in the response equals the numeric ground truth (relative tolerance)."""
    got = last_number(strip_answer(solution_str))
    want = ground_truth if isinstance(ground_truth, (int, float)) else last_number(str(ground_truth))
    if got is None or want is None:
        return 0.0
    return float(math.isclose(got, float(want), rel_tol=rel_tol, abs_tol=1e-12))


def math_match(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 iff math-verify finds the response's final answer equal to the ground truth.

    math-verify bounds its own work with SIGALRM, which only the main thread may use: in a scorer
    process (``rlctl.rewards.pool``, where the RewardManager runs it) that is where it runs; in
    any other thread its timeouts are switched off and the caller must bound the time.
    """
    from math_verify import parse, verify

    main = threading.current_thread() is threading.main_thread()
    t = 5 if main else None
    if not main:  # math-verify warns once that its timeout is off; the RewardManager bounds it
        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).setLevel(logging.ERROR)
    gold_text = str(ground_truth)
    if "$" not in gold_text and "\\boxed" not in gold_text:
        gold_text = f"${gold_text}$"
    gold = parse(gold_text, parsing_timeout=t)
    pred = parse(strip_answer(solution_str), parsing_timeout=t)
    if not gold or not pred:
        return 0.0
    return float(verify(gold, pred, timeout_seconds=t))


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
