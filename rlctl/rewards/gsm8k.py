"""GSM8K's reward as verl scores ``data_source = "openai/gsm8k"`` (verl/utils/reward_score/gsm8k.py).

Behaviour, read from verl's scorer (volcengine/verl, commit b178a3c, January 2026) so that a verl
user's GSM8K parquet earns the same rewards here:

- only the last 300 characters of the response are searched (verl's speed bound: a long
  chain of thought's final answer is at its end);
- strict mode (verl's default): the answer is the last ``#### N`` where N is a run of ASCII
  digits, dots and commas, optionally after one ``-``, and exactly one space follows ``####``;
  commas are removed; no such marker means no answer;
- flexible mode: the answer is the last run of ``-``/digits/dots/commas that is not a lone
  ``.`` (commas are kept, as verl keeps them);
- the answer is compared to the ground truth as text: ``score`` when equal, ``format_score``
  when an answer was found but differs, 0 when none was found. "72.0" is not "72".

One difference: a ground truth stored as a number (an int column) is compared as its text;
verl compares the string to the int and never matches.
"""

from __future__ import annotations

import re
from typing import Any

CLIP_CHARS = 300
METHODS = ("strict", "flexible")
_STRICT = re.compile(r"#### (-?[0-9.,]+)")
_FLEXIBLE = re.compile(r"-?[0-9.,]+")


def extract_answer(solution_str: str, method: str = "strict") -> str | None:
    """The GSM8K answer verl reads from ``solution_str`` in ``method`` mode, or None."""
    if method not in METHODS:
        raise ValueError(f"gsm8k method {method!r} unknown; expected one of: {', '.join(METHODS)}")
    tail = solution_str[-CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        return found[-1].replace(",", "") if found else None
    found = _FLEXIBLE.findall(tail)
    if not found:
        return None
    usable = [s for s in found if s != "."]
    # verl walks back to the last candidate that is not "."; when all are ".", it ends on the first
    return usable[-1] if usable else found[0]


def compute_score(
    solution_str: str,
    ground_truth: Any,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """verl's GSM8K reward: ``score`` for the right answer, ``format_score`` for a wrong one, 0 for none."""
    answer = extract_answer(solution_str, method)
    if answer is None:
        return 0.0
    return float(score) if answer == str(ground_truth) else float(format_score)


def gsm8k_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    method: str = "strict",
    format_score: float = 0.0,
) -> float:
    """``compute_score`` with verl's ``compute_score(data_source, solution_str, ground_truth, extra_info)``."""
    return compute_score(solution_str, ground_truth, method=method, format_score=format_score)
