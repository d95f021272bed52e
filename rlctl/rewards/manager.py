"""Score a batch of responses with one scorer; a failing or slow sample scores 0, never the run.

Scorers have verl's signature ``f(data_source, solution_str, ground_truth, extra_info)`` and
return a float or a dict with ``"score"`` (other keys are passed through per sample; ``"acc"`` and
``"timed_out"`` are understood). A sample whose scorer raises scores 0 and counts in
``reward/errors``; one that runs past ``timeout_s`` (or reports ``timed_out``) scores 0 and counts
in ``reward/timeouts``. Slow samples are left running on daemon threads and abandoned.
"""

from __future__ import annotations

import functools
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.errors import UserError
from rlctl.log import get_logger
from rlctl.rewards.code import code_score
from rlctl.rewards.custom import load_custom_reward
from rlctl.rewards.sandbox import SandboxLimits
from rlctl.rewards.verifiers import VERIFIERS

KINDS = ("builtin", "exact", "numeric", "math", "custom", "code", "reward_model")
VERIFIER_KINDS = ("builtin", "exact", "numeric", "math", "code")  # 0/1 scores: acc = score


@dataclass
class RewardOutput:
    """Per-sample scores (and acc when the scorer is a verifier), extra per-sample keys, batch metrics."""

    scores: list[float]
    acc: list[float] | None
    extra: dict[str, list[Any]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def _run_all(calls: list[Callable[[], Any]], workers: int, timeout_s: float | None) -> list[tuple[str, Any]]:
    """Run calls on up to ``workers`` daemon threads; each ends as ("ok"|"error"|"timeout", value)."""
    n = len(calls)
    status: list[tuple[str, Any] | None] = [None] * n
    started: list[float | None] = [None] * n
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(n):
        todo.put(i)
    lock, wake = threading.Lock(), threading.Event()

    def worker() -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            started[i] = time.monotonic()
            try:
                out: tuple[str, Any] = ("ok", calls[i]())
            except Exception as exc:  # a scorer's bug or bad input: that sample scores 0
                out = ("error", exc)
            with lock:
                if status[i] is None:
                    status[i] = out
            wake.set()

    def spawn() -> None:
        threading.Thread(target=worker, daemon=True, name="rlctl-reward").start()

    for _ in range(min(workers, n)):
        spawn()
    while True:
        wake.wait(0.01)
        wake.clear()
        with lock:
            now = time.monotonic()
            for i in range(n):
                t0 = started[i]
                if status[i] is None and timeout_s is not None and t0 is not None and now - t0 > timeout_s:
                    status[i] = ("timeout", None)
                    spawn()  # replace the thread stuck on this sample
            if all(s is not None for s in status):
                return [s for s in status if s is not None]


class RewardManager:
    """Applies one scorer to batches; counts errors and timeouts (per batch and in total)."""

    def __init__(
        self,
        fn: Callable[..., Any] | None,
        kind: str,
        timeout_s: float | None = None,
        num_workers: int = 1,
        reward_model: Any = None,
    ) -> None:
        if kind not in KINDS:
            raise UserError(f"reward kind {kind!r} unknown; expected one of: {', '.join(KINDS)}")
        self.fn, self.kind, self.timeout_s = fn, kind, timeout_s
        self.num_workers = max(1, num_workers)
        self.reward_model = reward_model
        self.errors_total = 0
        self.timeouts_total = 0
        self.log = get_logger("rlctl.reward", kind=kind)

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
        if self.kind == "reward_model":
            results = self._score_with_model(list(prompts or []), list(solutions))
        else:
            fn = self.fn
            assert fn is not None
            calls = [
                functools.partial(fn, ds, sol, gt, ei)
                for ds, sol, gt, ei in zip(data_sources, solutions, ground_truths, extra_infos, strict=True)
            ]
            if self.timeout_s is None and self.num_workers == 1:
                results = []
                for call in calls:
                    try:
                        results.append(("ok", call()))
                    except Exception as exc:
                        results.append(("error", exc))
            else:
                results = _run_all(calls, self.num_workers, self.timeout_s)
        return self._collect(results, data_sources)

    __call__ = score

    def _score_with_model(self, prompts: list[Any], solutions: list[str]) -> list[tuple[str, Any]]:
        if len(prompts) != len(solutions):
            return [("error", ValueError("the reward_model kind needs the prompts"))] * len(solutions)
        try:
            return [("ok", s) for s in self.reward_model.score(prompts, solutions)]
        except Exception as exc:
            return [("error", exc)] * len(solutions)

    def _collect(self, results: list[tuple[str, Any]], data_sources: Sequence[str]) -> RewardOutput:
        scores: list[float] = []
        accs: list[float] = []
        extra: dict[str, list[Any]] = {}
        errors = timeouts = 0
        first_error: str | None = None
        for i, (status, value) in enumerate(results):
            score, acc, info = 0.0, 0.0, {}
            if status == "ok":
                try:
                    score, acc, info = self._interpret(value)
                except (TypeError, ValueError) as exc:
                    status, value = "error", exc
            if status == "error":
                errors += 1
                first_error = first_error or f"{data_sources[i]}: {type(value).__name__}: {value}"
            elif status == "timeout" or info.get("timed_out"):
                timeouts += 1
                score = acc = 0.0
            scores.append(score)
            accs.append(acc)
            for k, v in info.items():
                extra.setdefault(k, [None] * len(results))[i] = v
        self.errors_total += errors
        self.timeouts_total += timeouts
        if first_error:
            self.log.warning("reward function failed; scored 0", errors=errors, first=first_error)
        n = max(1, len(scores))
        metrics = {
            "reward/errors": float(errors),
            "reward/timeouts": float(timeouts),
            "reward/mean": sum(scores) / n,
        }
        has_acc = self.kind != "reward_model"
        if has_acc:
            metrics["reward/acc"] = sum(accs) / n
        return RewardOutput(scores, accs if has_acc else None, extra, metrics)

    def _interpret(self, value: Any) -> tuple[float, float, dict[str, Any]]:
        """(score, acc, other keys) of one scorer result; ValueError/TypeError if unusable."""
        info: dict[str, Any] = {}
        if isinstance(value, dict):
            if "score" not in value:
                raise ValueError(f"reward dict has no 'score' key (keys: {sorted(value)})")
            info = {k: v for k, v in value.items() if k != "score"}
            value = value["score"]
        score = float(value)
        if not math.isfinite(score):
            raise ValueError(f"reward is not finite: {score}")
        acc = info.pop("acc", None)
        acc = float(acc) if acc is not None else float(score >= 1.0)
        return score, acc, info


def build_reward_manager(
    kind: str = "builtin",
    function: str | None = None,
    base_dir: str | Path | None = None,
    model_path: str | Path | None = None,
    sandbox: SandboxLimits | None = None,
    timeout_s: float | None = None,
    num_workers: int | None = None,
    device: str = "cpu",
) -> RewardManager:
    """The RewardManager a profile asks for.

    kind: builtin (built-in task verifiers by data_source) | exact | numeric | math |
    custom (``function="path/file.py:name"``) | code (sandboxed execution) |
    reward_model (``model_path``: a local sequence-classification model).
    Defaults: builtin/exact/numeric run inline; math and custom get a 10 s per-sample timeout;
    code runs 4 samples at once, each bounded by the sandbox.
    """
    if kind == "custom":
        if not function:
            raise UserError("reward kind 'custom' needs reward.function = 'path/to/file.py:name'")
        fn: Callable[..., Any] | None = load_custom_reward(function, base_dir)
        timeout_s = 10.0 if timeout_s is None else timeout_s
    elif kind == "code":
        fn = functools.partial(code_score, limits=sandbox or SandboxLimits())
        num_workers = num_workers or 4
    elif kind == "reward_model":
        if not model_path:
            raise UserError("reward kind 'reward_model' needs reward.model_path = a local model directory")
        from rlctl.rewards.reward_model import RewardModelScorer

        return RewardManager(None, kind, reward_model=RewardModelScorer(model_path, device=device))
    elif kind in VERIFIERS:
        fn = VERIFIERS[kind]
        if kind == "math":
            timeout_s = 10.0 if timeout_s is None else timeout_s
    else:
        raise UserError(f"reward kind {kind!r} unknown; expected one of: {', '.join(KINDS)}")
    return RewardManager(fn, kind, timeout_s=timeout_s, num_workers=num_workers or 1)
