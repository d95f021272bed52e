"""The numbers a reader wants first: steps, validation accuracy and when it reached a target, speed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import fmean
from typing import Any

from rlctl.report.reader import Record

VAL_KEY = "val/accuracy"
TIME_KEY = "train_time_s"


def series(records: Sequence[Record], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the records that hold a non-null ``key``."""
    steps, values = [], []
    for rec in records:
        value = rec.get(key)
        if value is not None:
            steps.append(rec["step"])
            values.append(float(value))
    return steps, values


def is_train_record(rec: Record) -> bool:
    """A record of a training step (not only a validation, e.g. the initial one at step 0)."""
    return any(k not in ("step", "time/val") and not k.startswith("val/") for k in rec if rec[k] is not None)


def train_seconds_at(records: Sequence[Record], step: int) -> float | None:
    """The training clock after ``step``: its own ``train_time_s``, else the latest before it, else 0."""
    best: float | None = None
    for rec in records:
        if rec["step"] > step:
            break
        if rec.get(TIME_KEY) is not None:
            best = float(rec[TIME_KEY])
    if best is None and not any(r.get(TIME_KEY) is not None for r in records):
        return None
    return 0.0 if best is None else best


@dataclass
class Summary:
    """What ``rlctl report`` prints and ``--json`` emits."""

    steps: int
    first_step: int | None
    last_step: int | None
    train_time_s: float | None
    threshold: float
    validations: int
    initial_val_accuracy: float | None
    final_val_accuracy: float | None
    best_val_accuracy: float | None
    best_val_step: int | None
    first_reach_step: int | None
    first_reach_train_s: float | None
    held_from_step: int | None
    held_from_train_s: float | None
    validations_held: int
    mean_s_per_step: float | None
    mean_tokens_per_s: float | None
    final_reward_mean: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean_s_per_step(records: Sequence[Record], train: Sequence[Record]) -> float | None:
    _, step_times = series(train, "time/step")
    if step_times:
        return fmean(step_times)
    clock = [(r["step"], float(r[TIME_KEY])) for r in train if r.get(TIME_KEY) is not None]
    if len(clock) >= 2 and clock[-1][0] > clock[0][0]:
        return (clock[-1][1] - clock[0][1]) / (clock[-1][0] - clock[0][0])
    if len(clock) == 1 and clock[0][0] > 0:
        return clock[0][1] / clock[0][0]
    return None


def summarize(records: Sequence[Record], threshold: float = 0.8) -> Summary:
    """Summary of a run's records (sorted by step, as ``load_metrics`` returns them).

    ``first_reach``: the first validation with accuracy >= ``threshold``. ``held_from``: the first
    validation from which every later one is >= ``threshold`` (None if the last one is below);
    ``validations_held`` counts the validations from there on. Train seconds exclude validation.
    """
    train = [r for r in records if is_train_record(r)]
    val_steps, val_acc = series(records, VAL_KEY)
    first_reach = next((s for s, a in zip(val_steps, val_acc, strict=True) if a >= threshold), None)
    held_idx: int | None = None
    for i in range(len(val_acc) - 1, -1, -1):
        if val_acc[i] < threshold:
            break
        held_idx = i
    held_from = val_steps[held_idx] if held_idx is not None else None
    best_i = max(range(len(val_acc)), key=lambda i: (val_acc[i], -i)) if val_acc else None
    _, rewards = series(train, "reward/score_mean")
    _, tokens = series(train, "perf/tokens_per_s")
    _, clock = series(train, TIME_KEY)
    return Summary(
        steps=len(train),
        first_step=train[0]["step"] if train else None,
        last_step=train[-1]["step"] if train else None,
        train_time_s=clock[-1] if clock else None,
        threshold=threshold,
        validations=len(val_acc),
        initial_val_accuracy=val_acc[0] if val_acc else None,
        final_val_accuracy=val_acc[-1] if val_acc else None,
        best_val_accuracy=val_acc[best_i] if best_i is not None else None,
        best_val_step=val_steps[best_i] if best_i is not None else None,
        first_reach_step=first_reach,
        first_reach_train_s=train_seconds_at(records, first_reach) if first_reach is not None else None,
        held_from_step=held_from,
        held_from_train_s=train_seconds_at(records, held_from) if held_from is not None else None,
        validations_held=len(val_acc) - held_idx if held_idx is not None else 0,
        mean_s_per_step=_mean_s_per_step(records, train),
        mean_tokens_per_s=fmean(tokens) if tokens else None,
        final_reward_mean=fmean(rewards[-10:]) if rewards else None,
    )


def _num(value: float | None, fmt: str = ".3f", unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{fmt}}{unit}"


def summary_lines(s: Summary) -> list[tuple[str, str]]:
    """(label, text) rows shared by the terminal output and report.md."""
    steps = f"{s.steps} training steps"
    if s.first_step is not None:
        steps += f" ({s.first_step}..{s.last_step})"
    if s.train_time_s is not None:
        steps += f", {s.train_time_s:.1f} s of training"
    val = "no validation recorded"
    if s.validations:
        val = (
            f"{_num(s.initial_val_accuracy)} first, {_num(s.final_val_accuracy)} final, "
            f"best {_num(s.best_val_accuracy)} at step {s.best_val_step} ({s.validations} validations)"
        )
    reach = "never reached"
    if s.first_reach_step is not None:
        reach = f"first at step {s.first_reach_step} ({_num(s.first_reach_train_s, '.1f', ' s')} of training)"
        if s.held_from_step is not None:
            reach += (
                f"; held from step {s.held_from_step} ({_num(s.held_from_train_s, '.1f', ' s')}), "
                f"{s.validations_held} validations"
            )
        else:
            reach += "; not held to the end"
    speed = f"{_num(s.mean_s_per_step, '.3f', ' s/step')}, {_num(s.mean_tokens_per_s, '.0f', ' tokens/s')}"
    return [
        ("steps", steps),
        ("val accuracy", val),
        (f"val >= {s.threshold:g}", reach),
        ("speed", speed),
        ("reward (last 10)", _num(s.final_reward_mean)),
    ]


def summary_text(s: Summary) -> str:
    """The summary as aligned plain-text lines."""
    rows = summary_lines(s)
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {text}" for label, text in rows)
