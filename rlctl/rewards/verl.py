"""``reward.kind = "verl"``: each row scored by the scorer verl's ``default_compute_score`` picks for its data_source.

The dispatch table is verl's (verl/utils/reward_score/__init__.py, volcengine/verl commit
b178a3c, January 2026), so a parquet prepared with verl's data scripts trains with no custom
function:

- ``openai/gsm8k``: verl's GSM8K scorer (``rlctl.rewards.gsm8k``; strict mode, 1 / 0 unless the
  profile asks for flexible mode or a format score);
- ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``, ``HuggingFaceH4/MATH-500``: the last
  ``\\boxed{...}`` of the response, compared with math-verify (verl compares it with lm-eval's
  string normalisation and names math-verify as the more accurate option); 1 / 0, no box is 0;
- ``math_dapo``, ``math``, ``math_dapo_reasoning`` and any source starting with ``aime``: DAPO's
  reward: the last ``Answer: ...`` line in the last 300 characters, compared with math-verify
  (verl: Minerva string normalisation); score 1 / -1, with ``acc`` and ``pred``;
- ``rlctl/<task>``: the built-in task's verifier, so built-in and verl rows can be mixed.

verl's other sources (PRIME math, code contests, geometry3k, Search-R1) and any unknown source
are refused, naming the source, before a batch is scored: scoring them 0 would train on noise.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from typing import Any

from rlctl.data.tasks import task_for_source
from rlctl.errors import UserError
from rlctl.rewards.answers import equivalent, ground_truth_answer, last_boxed
from rlctl.rewards.gsm8k import gsm8k_score
from rlctl.rewards.verifiers import builtin_score

MATH_SOURCES = frozenset({"lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"})
DAPO_SOURCES = frozenset({"math_dapo", "math", "math_dapo_reasoning"})
# Sources verl scores with scorers rlctl does not ship: (source names, verl's scorer, what to use here).
_NOT_SHIPPED = (
    (
        {
            "numina_aops_forum",
            "numina_synthetic_math",
            "numina_amc_aime",
            "numina_synthetic_amc",
            "numina_cn_k12",
            "numina_olympiads",
        },
        "prime_math",
        "reward.kind = 'custom'",
    ),
    ({"codecontests", "apps", "codeforces", "taco"}, "prime_code / sandbox_fusion", "reward.kind = 'code'"),
    ({"hiyouga/geometry3k"}, "geo3k", "reward.kind = 'custom'"),
    (
        {
            "searchR1_nq",
            "searchR1_triviaqa",
            "searchR1_popqa",
            "searchR1_hotpotqa",
            "searchR1_2wikimultihopqa",
            "searchR1_musique",
            "searchR1_bamboogle",
        },
        "search_r1_like_qa_em",
        "reward.kind = 'custom'",
    ),
)
DAPO_CLIP_CHARS = 300
_DAPO_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


def math_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """MATH sources: 1.0 iff the response's last box equals the ground truth by value, else 0.0."""
    return float(equivalent(last_boxed(solution_str), ground_truth_answer(ground_truth)))


def dapo_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> dict[str, Any]:
    """DAPO sources: ``score`` 1.0 / -1.0 by the last ``Answer: X`` line, with ``acc`` and ``pred`` as verl reports."""
    found = _DAPO_ANSWER.findall(solution_str[-DAPO_CLIP_CHARS:])
    pred = found[-1].strip() if found else "[INVALID]"
    ok = bool(found) and equivalent(pred, ground_truth_answer(ground_truth))
    return {"score": 1.0 if ok else -1.0, "acc": float(ok), "pred": pred}


def scorer_for_source(
    data_source: str, gsm8k_method: str = "strict", format_score: float = 0.0
) -> Callable[..., Any]:
    """The scorer for ``data_source``; UserError naming it when verl has none or rlctl does not ship it."""
    if data_source == "openai/gsm8k":
        return functools.partial(gsm8k_score, method=gsm8k_method, format_score=format_score)
    if data_source in MATH_SOURCES:
        return math_score
    if data_source in DAPO_SOURCES or data_source.startswith("aime"):
        return dapo_score
    if task_for_source(data_source) is not None:
        return builtin_score
    for names, verl_scorer, instead in _NOT_SHIPPED:
        if data_source in names:
            raise UserError(
                f"reward.kind = 'verl': data_source {data_source!r} is scored by verl's {verl_scorer}, "
                f"which rlctl does not ship; use {instead}"
            )
    raise UserError(
        f"reward.kind = 'verl': no scorer for data_source {data_source!r}; expected openai/gsm8k, "
        f"{', '.join(sorted(MATH_SOURCES | DAPO_SOURCES))}, aime*, rlctl/<task> (or use reward.kind = 'custom')"
    )


def check_sources(data_sources: Iterable[str]) -> None:
    """Raise UserError naming the first data_source that ``reward.kind = "verl"`` cannot score."""
    for source in sorted(set(data_sources)):
        scorer_for_source(source)


def verl_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    gsm8k_method: str = "strict",
    format_score: float = 0.0,
) -> float | dict[str, Any]:
    """verl's ``default_compute_score``: the score of one row by the scorer its data_source names."""
    scorer = scorer_for_source(data_source, gsm8k_method, format_score)
    return scorer(data_source, solution_str, ground_truth, extra_info)


def load_verl_scorer(gsm8k_method: str = "strict", format_score: float = 0.0) -> Callable[..., Any]:
    """``verl_score`` with the profile's GSM8K options (a picklable loader for scorer processes)."""
    return functools.partial(verl_score, gsm8k_method=gsm8k_method, format_score=format_score)
