"""Score a batch of responses with one scorer; a failing sample scores 0, a failing scorer stops the run.

Scorers have verl's signature ``f(data_source, solution_str, ground_truth, extra_info)`` and
return a float or a dict with ``"score"`` (other keys are passed through per sample; ``"acc"`` and
``"timed_out"`` are understood). A sample whose scorer raises (or returns something unusable:
no ``score``, not finite) scores 0 and counts in ``reward/errors``; one that runs past
``timeout_s`` (or reports ``timed_out``) scores 0 and counts in ``reward/timeouts``; one whose
parse goes past a bound (``rlctl.rewards.limits``: an answer too costly to evaluate, the scorer
process's memory limit, a recursion limit) scores 0 and counts in ``reward/over_limit``.

Where the work runs:
- custom, math and verl scorers (and any scorer given a ``timeout_s``): a pool of worker processes
  (``rlctl.rewards.pool``); a sample past its limit is killed with its process, which is replaced;
  math and verl workers' heaps are bounded (``SCORER_DATA_LIMIT_MB``; custom code is the user's);
- code: threads that each wait on one sandboxed subprocess (the sandbox bounds and kills it);
- builtin, exact, numeric: inline (linear-time parses: microseconds per sample, nothing to bound).

Errors are a scorer's bug, not the policy's doing, so they are bounded: when more than
``max_error_rate`` of one scoring pass raise, ``score`` raises RunError whose first line names
the scorer, the count and the first error, followed by that sample's full traceback. Timeouts
are not counted against it: a response can legitimately make a verifier slow (a pathological
expression for math-verify, an endless loop in a code answer), and such a response earns 0.
"""

from __future__ import annotations

import functools
import math
import traceback
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlctl.errors import RunError, UserError
from rlctl.log import get_logger
from rlctl.rewards.code import code_score
from rlctl.rewards.custom import load_custom_reward
from rlctl.rewards.limits import LIMIT_ERRORS, SCORER_DATA_LIMIT_MB
from rlctl.rewards.pool import Outcome, ScorerPool, describe
from rlctl.rewards.sandbox import SandboxLimits
from rlctl.rewards.verifiers import VERIFIERS, load_verifier
from rlctl.rewards.verl import check_sources, load_verl_scorer

KINDS = ("builtin", "exact", "numeric", "math", "verl", "custom", "code", "reward_model")
VERIFIER_KINDS = ("builtin", "exact", "numeric", "math", "code")  # 0/1 scores: acc = score
# One scorer error in ten samples is already far above what a correct scorer produces (none), yet
# leaves room for a rare parser failure on a garbled response; past it, a tenth of the batch would
# train on made-up zeros, which bends every group's advantages. 0 = no error allowed, 1 = never stop.
DEFAULT_MAX_ERROR_RATE = 0.1


@dataclass
class RewardOutput:
    """Per-sample scores, acc (verifiers and scorers that report it), extra keys, batch metrics.

    ``signal_acc`` is what dynamic sampling filters on under its default metric ``acc``: the
    scorer's own acc where it reports one (verifiers: their 0/1 score), else its score -- as
    verl's DAPO reward manager stores a float result as ``acc``.
    """

    scores: list[float]
    acc: list[float] | None
    extra: dict[str, list[Any]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    signal_acc: list[float] = field(default_factory=list)


def _call_inline(fn: Callable[..., Any], args: tuple[Any, ...]) -> Outcome:
    try:
        return Outcome("ok", fn(*args))
    except LIMIT_ERRORS as exc:  # the response made the parse too costly: it scores 0, counted
        return Outcome("limit", reason=describe(exc))
    except Exception as exc:  # a scorer's bug or bad input: that sample scores 0
        return Outcome("error", reason=describe(exc), traceback=traceback.format_exc())


class _Returns:
    """A picklable loader for a scorer that is already a plain (importable) function."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self) -> Callable[..., Any]:
        return self.fn


class RewardManager:
    """Applies one scorer to batches. Holds no per-batch state: ``score`` returns the metrics."""

    def __init__(
        self,
        fn: Callable[..., Any] | None,
        kind: str,
        timeout_s: float | None = None,
        num_workers: int = 1,
        reward_model: Any = None,
        *,
        loader: Callable[[], Callable[..., Any]] | None = None,
        name: str | None = None,
        max_error_rate: float = DEFAULT_MAX_ERROR_RATE,
        data_limit_mb: int | None = None,
    ) -> None:
        if kind not in KINDS:
            raise UserError(f"reward kind {kind!r} unknown; expected one of: {', '.join(KINDS)}")
        self.fn, self.kind, self.timeout_s = fn, kind, timeout_s
        self.num_workers = max(1, num_workers)
        self.reward_model = reward_model
        self.name = name or kind
        self.max_error_rate = max_error_rate
        self.log = get_logger("rlctl.reward", kind=kind)
        self.pool: ScorerPool | None = None
        if kind != "reward_model" and (loader is not None or timeout_s is not None):
            if loader is None:
                assert fn is not None
                loader = _Returns(fn)
            self.pool = ScorerPool(loader, self.num_workers, timeout_s, self.name, data_limit_mb)
            weakref.finalize(self, self.pool.close)

    def close(self) -> None:
        """Stop the scorer processes (they also end with the driver)."""
        if self.pool is not None:
            self.pool.close()

    def score(
        self,
        data_sources: Sequence[str],
        solutions: Sequence[str],
        ground_truths: Sequence[Any],
        extra_infos: Sequence[Any] | None = None,
        prompts: Sequence[list[dict[str, str]]] | None = None,
    ) -> RewardOutput:
        """Score every sample; ``prompts`` (chat messages) are needed by the reward-model kind only."""
        n = len(solutions)
        extra_infos = list(extra_infos) if extra_infos is not None else [{} for _ in range(n)]
        if not (len(data_sources) == len(ground_truths) == len(extra_infos) == n):
            raise ValueError("reward inputs must all have the same length")
        if self.kind == "verl":  # an unknown data_source stops the step, named, before any scoring
            check_sources(data_sources)
        if self.kind == "reward_model":
            results = self._score_with_model(list(prompts or []), list(solutions))
        else:
            calls = list(zip(data_sources, solutions, ground_truths, extra_infos, strict=True))
            if self.pool is not None:
                results = self.pool.run(calls)
            elif self.num_workers > 1:
                fn = self.fn
                assert fn is not None
                with ThreadPoolExecutor(self.num_workers, thread_name_prefix="rlctl-reward") as ex:
                    results = list(ex.map(functools.partial(_call_inline, fn), calls))
            else:
                fn = self.fn
                assert fn is not None
                results = [_call_inline(fn, args) for args in calls]
        return self._collect(results, data_sources)

    __call__ = score

    def _score_with_model(self, prompts: list[Any], solutions: list[str]) -> list[Outcome]:
        if len(prompts) != len(solutions):
            return [Outcome("error", reason="ValueError: the reward_model kind needs the prompts")] * len(
                solutions
            )
        try:
            return [Outcome("ok", s) for s in self.reward_model.score(prompts, solutions)]
        except Exception as exc:
            return [Outcome("error", reason=describe(exc), traceback=traceback.format_exc())] * len(solutions)

    def _collect(self, results: list[Outcome], data_sources: Sequence[str]) -> RewardOutput:
        scores: list[float] = []
        accs: list[float] = []
        signal: list[float] = []
        extra: dict[str, list[Any]] = {}
        errors = timeouts = over_limit = 0
        first: Outcome | None = None
        first_source = ""
        for i, res in enumerate(results):
            score, acc, reported, info = 0.0, 0.0, None, {}
            if res.status == "ok":
                try:
                    score, reported, info = self._interpret(res.value)
                    acc = reported if reported is not None else float(score >= 1.0)
                except (TypeError, ValueError) as exc:
                    res = Outcome("error", reason=describe(exc), traceback=f"result: {res.value!r}")
            if res.status == "error":
                errors += 1
                if first is None:
                    first, first_source = res, data_sources[i]
            elif res.status == "timeout" or info.get("timed_out"):
                timeouts += 1
                score = acc = 0.0
                reported = None
            elif res.status == "limit":
                over_limit += 1
            scores.append(score)
            accs.append(acc)
            signal.append(reported if reported is not None else score)
            for k, v in info.items():
                extra.setdefault(k, [None] * len(results))[i] = v
        n = len(scores)
        if first is not None:
            headline = (
                f"reward {self.name}: {errors} of {n} samples raised; "
                f"first ({first_source}): {first.reason}".replace("\n", " ")
            )
            if errors > self.max_error_rate * n:
                detail = (
                    f"\n--- first failing sample's traceback ---\n{first.traceback}"
                    if first.traceback
                    else ""
                )
                raise RunError(
                    f"{headline} (above reward.max_error_rate = {self.max_error_rate:g}){detail}".rstrip()
                )
            self.log.warning("reward function failed on some samples; they scored 0", detail=headline)
        metrics = {
            "reward/errors": float(errors),
            "reward/timeouts": float(timeouts),
            "reward/over_limit": float(over_limit),
            "reward/mean": sum(scores) / max(1, n),
        }
        has_acc = self.kind != "reward_model"
        if has_acc:
            metrics["reward/acc"] = sum(accs) / max(1, n)
        return RewardOutput(scores, accs if has_acc else None, extra, metrics, signal)

    def _interpret(self, value: Any) -> tuple[float, float | None, dict[str, Any]]:
        """(score, the scorer's own acc or None, other keys) of one result; ValueError/TypeError if unusable."""
        info: dict[str, Any] = {}
        if isinstance(value, dict):
            if "score" not in value:
                raise ValueError(f"reward dict has no 'score' key (keys: {sorted(value)})")
            info = {k: v for k, v in value.items() if k != "score"}
            value = value["score"]
        score = reward_number("score", value)
        acc = info.pop("acc", None)
        if acc is not None:
            acc = reward_number("acc", acc)
        for key, extra in info.items():  # logged per sample: the same bound where numeric
            if _is_number(extra):
                reward_number(key, extra)
        if self.kind in VERIFIER_KINDS and acc is None:
            acc = score
        return score, acc, info


FLOAT32_MAX = float(np.finfo(np.float32).max)


def reward_number(key: str, value: Any) -> float:
    """``value`` as a reward: a real number (not a bool or a string) finite in float32, where the
    advantages are computed (a finite 1e39 becomes inf there and every advantage of its group NaN)."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # a 0-d tensor or array
        value = value.item()
    if not _is_number(value):
        raise TypeError(f"reward {key!r} must be a number, got {type(value).__name__} {value!r}")
    number = float(value)
    if not math.isfinite(number) or abs(number) > FLOAT32_MAX:
        raise ValueError(f"reward {key!r} is {number!r}: not finite in float32 (|x| <= {FLOAT32_MAX:.4g})")
    return number


def _is_number(value: Any) -> bool:
    """A real number: Python or numpy ints and floats, bools excluded."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )


def default_workers() -> int:
    """Scorer processes (custom, math) and concurrent sandboxes (code) when the profile says 0."""
    import os

    return max(1, min(4, os.cpu_count() or 1))


def build_reward_manager(
    kind: str = "builtin",
    function: str | None = None,
    base_dir: str | Path | None = None,
    model_path: str | Path | None = None,
    sandbox: SandboxLimits | None = None,
    timeout_s: float | None = None,
    num_workers: int | None = None,
    device: str = "cpu",
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE,
    gsm8k_method: str = "strict",
    format_score: float = 0.0,
) -> RewardManager:
    """The RewardManager a profile asks for.

    kind: builtin (built-in task verifiers by data_source) | exact | numeric | math |
    verl (verl's default scorer by each row's data_source: GSM8K, MATH, DAPO; see rlctl.rewards.verl) |
    custom (``function="path/file.py:name"``) | code (sandboxed execution) |
    reward_model (``model_path``: a local sequence-classification model).
    ``gsm8k_method`` (strict | flexible) and ``format_score`` are verl's GSM8K options (kind = verl).
    Defaults: builtin/exact/numeric run inline; math, verl and custom run in ``num_workers`` scorer
    processes with a 10 s per-sample timeout; code runs ``num_workers`` sandboxes at once.
    """
    workers = num_workers or default_workers()
    common: dict[str, Any] = {"max_error_rate": max_error_rate}
    if kind == "custom":
        if not function:
            raise UserError("reward kind 'custom' needs reward.function = 'path/to/file.py:name'")
        fn: Callable[..., Any] | None = load_custom_reward(function, base_dir)  # checked here, loud
        resolved = function if base_dir is None else str(_resolve_spec(function, base_dir))
        loader = functools.partial(load_custom_reward, resolved)
        timeout_s = 10.0 if timeout_s is None else timeout_s
        return RewardManager(fn, kind, timeout_s, workers, loader=loader, name=function, **common)
    if kind == "code":
        fn = functools.partial(code_score, limits=sandbox or SandboxLimits())
        return RewardManager(fn, kind, None, workers, name="code (sandbox)", **common)
    if kind == "reward_model":
        if not model_path:
            raise UserError("reward kind 'reward_model' needs reward.model_path = a local model directory")
        from rlctl.rewards.reward_model import RewardModelScorer

        scorer = RewardModelScorer(model_path, device=device)
        return RewardManager(None, kind, reward_model=scorer, name=f"reward_model {model_path}", **common)
    if kind == "math":
        timeout_s = 10.0 if timeout_s is None else timeout_s
        loader = functools.partial(load_verifier, "math")
        return RewardManager(
            VERIFIERS[kind], kind, timeout_s, workers, loader=loader, name="math",
            data_limit_mb=SCORER_DATA_LIMIT_MB, **common,
        )  # fmt: skip
    if kind == "verl":
        if gsm8k_method not in ("strict", "flexible"):
            raise UserError(f"reward.gsm8k_method = {gsm8k_method!r}; expected strict or flexible")
        timeout_s = 10.0 if timeout_s is None else timeout_s
        loader = functools.partial(load_verl_scorer, gsm8k_method, format_score)
        return RewardManager(
            loader(), kind, timeout_s, workers, loader=loader, name="verl",
            data_limit_mb=SCORER_DATA_LIMIT_MB, **common,
        )  # fmt: skip
    if kind in VERIFIERS:
        return RewardManager(VERIFIERS[kind], kind, timeout_s, 1, name=kind, **common)
    raise UserError(f"reward kind {kind!r} unknown; expected one of: {', '.join(KINDS)}")


def _resolve_spec(spec: str, base_dir: str | Path) -> str:
    """``file.py:name`` with a relative file made absolute against ``base_dir``."""
    from rlctl.rewards.custom import parse_function_spec

    path, name = parse_function_spec(spec)
    if not path.is_absolute():
        path = Path(base_dir) / path
    return f"{path.resolve()}:{name}"
