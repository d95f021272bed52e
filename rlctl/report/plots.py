"""PNG plots of a run, drawn with matplotlib's object API (Agg canvas, no pyplot global state).

Each plot function returns a Figure, or None when the run holds none of its metrics (a GRPO run
has no critic, a run without validation has no accuracy curve). Noisy per-step series are drawn
faint with a moving average on top.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from matplotlib import style
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, ScalarFormatter

from rlctl.report.reader import Record
from rlctl.report.summary import VAL_KEY, is_train_record, series, train_seconds_at

STYLE = "seaborn-v0_8-whitegrid"
STAGE_ORDER = [
    "gen",
    "old_log_prob",
    "ref",
    "reward",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "sync",
]


def smooth(values: Sequence[float], window: int) -> np.ndarray:
    """Trailing moving average over up to ``window`` points (shorter at the start)."""
    y = np.asarray(values, dtype=float)
    if window <= 1 or y.size == 0:
        return y
    csum = np.cumsum(np.insert(y, 0, 0.0))
    idx = np.arange(1, y.size + 1)
    lo = np.maximum(idx - window, 0)
    return (csum[idx] - csum[lo]) / (idx - lo)


def _window(n: int) -> int:
    return max(1, n // 25) if n > 30 else 1


def _line(ax: Axes, x: Sequence[float], y: Sequence[float], label: str, color: str) -> None:
    """Raw series (faint when smoothed) plus its moving average."""
    w = _window(len(y))
    if w > 1 and max(y) > min(y):
        ax.plot(x, y, color=color, alpha=0.25, linewidth=0.8)
        ax.plot(x, smooth(y, w), color=color, linewidth=1.8, label=f"{label} (avg {w})")
    else:
        ax.plot(
            x, y, color=color, linewidth=1.6, marker="o" if len(y) <= 30 else None, markersize=3, label=label
        )


def _finish(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if xlabel == "step":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    formatter = ax.yaxis.get_major_formatter()
    if isinstance(formatter, ScalarFormatter):
        formatter.set_useOffset(False)  # no "1e-14+1e-2" on flat series
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small", frameon=True)


def _figure(ncols: int, title: str) -> Figure:
    fig = Figure(figsize=(6.0 * ncols, 4.2), dpi=110, layout="constrained")
    fig.suptitle(title, fontweight="bold")
    return fig


def plot_reward(records: Sequence[Record], run: str) -> Figure | None:
    steps, mean = series(records, "reward/score_mean")
    acc_steps, acc = series(records, "reward/accuracy")
    if not steps and not acc_steps:
        return None
    fig = _figure(2, f"Reward: {run}")
    ax1, ax2 = fig.subplots(1, 2)
    if steps:
        std_by_step = dict(zip(*series(records, "reward/score_std"), strict=True))
        _line(ax1, steps, mean, "score mean", "tab:blue")
        if std_by_step:
            m = smooth(mean, _window(len(mean)))
            sd = smooth([std_by_step.get(s, 0.0) for s in steps], _window(len(mean)))
            ax1.fill_between(steps, m - sd, m + sd, color="tab:blue", alpha=0.15, label="± std")
    _finish(ax1, "Score (mean ± std over responses)", "step", "score")
    if acc_steps:
        _line(ax2, acc_steps, acc, "train accuracy", "tab:green")
    val_steps, val = series(records, VAL_KEY)
    if val_steps:
        ax2.plot(val_steps, val, "D--", color="tab:red", markersize=4, linewidth=1, label="val accuracy")
    ax2.set_ylim(-0.02, 1.02)
    _finish(ax2, "Accuracy", "step", "accuracy")
    return fig


def plot_val_accuracy(records: Sequence[Record], run: str, threshold: float = 0.8) -> Figure | None:
    steps, acc = series(records, VAL_KEY)
    if not steps:
        return None
    fig = _figure(2, f"Validation accuracy: {run}")
    ax1, ax2 = fig.subplots(1, 2)
    secs = [train_seconds_at(records, s) for s in steps]
    panels = [(ax1, steps, "step", "vs step")]
    if all(t is not None for t in secs):
        panels.append((ax2, secs, "training time (s, validation excluded)", "vs training time"))
    else:
        ax2.text(0.5, 0.5, "no train_time_s recorded", ha="center", va="center", transform=ax2.transAxes)
    first = next((i for i, a in enumerate(acc) if a >= threshold), None)
    for ax, x, xlabel, title in panels:
        ax.plot(x, acc, "o-", color="tab:red", markersize=4, linewidth=1.6, label="val accuracy")
        ax.axhline(threshold, color="gray", linestyle="--", linewidth=1, label=f"target {threshold:g}")
        if first is not None:
            ax.plot([x[first]], [acc[first]], "*", color="gold", markeredgecolor="black", markersize=14,
                    label=f"first >= {threshold:g}: {x[first]:.4g}")  # fmt: skip
        ax.set_ylim(-0.02, 1.02)
        _finish(ax, title, xlabel, "greedy accuracy")
    return fig


def _single(
    records: Sequence[Record], key: str, title: str, ylabel: str, color: str, run: str
) -> Figure | None:
    steps, values = series(records, key)
    if not steps:
        return None
    fig = _figure(1, f"{title}: {run}")
    ax = fig.subplots()
    _line(ax, steps, values, key, color)
    _finish(ax, key, "step", ylabel)
    return fig


def plot_kl(records: Sequence[Record], run: str) -> Figure | None:
    """The KL loss's value (``actor/kl_loss``), else the in-reward penalty's KL."""
    key = "actor/kl_loss" if series(records, "actor/kl_loss")[0] else "actor/reward_kl_penalty"
    return _single(records, key, "KL to reference", "KL", "tab:purple", run)


def plot_entropy(records: Sequence[Record], run: str) -> Figure | None:
    return _single(records, "actor/entropy", "Policy entropy", "entropy (nats/token)", "tab:orange", run)


def plot_response_length(records: Sequence[Record], run: str) -> Figure | None:
    steps, mean = series(records, "response_length/mean")
    max_steps, mx = series(records, "response_length/max")
    clip_steps, clip = series(records, "response_length/clip_ratio")
    if not (steps or max_steps or clip_steps):
        return None
    fig = _figure(2, f"Response length: {run}")
    ax1, ax2 = fig.subplots(1, 2)
    if steps:
        _line(ax1, steps, mean, "mean", "tab:blue")
    if max_steps:
        _line(ax1, max_steps, mx, "max", "tab:gray")
    _finish(ax1, "Response length", "step", "tokens")
    if clip_steps:
        _line(ax2, clip_steps, clip, "clip ratio", "tab:red")
        ax2.set_ylim(-0.02, 1.02)
    _finish(ax2, "Responses cut at the length limit", "step", "fraction")
    return fig


def plot_timing(records: Sequence[Record], run: str) -> Figure | None:
    train = [r for r in records if is_train_record(r)]
    keys = {k for r in train for k in r if k.startswith("time/") and k != "time/step"}
    stages = [s for s in STAGE_ORDER if f"time/{s}" in keys] + sorted(
        k[5:] for k in keys if k[5:] not in STAGE_ORDER
    )
    total_steps, total = series(train, "time/step")
    if not stages and not total_steps:
        return None
    fig = _figure(2, f"Seconds per stage: {run}")
    ax1, ax2 = fig.subplots(1, 2)
    steps = [r["step"] for r in train]
    w = _window(len(steps))
    if stages:
        ys = [smooth([r.get(f"time/{s}") or 0.0 for r in train], w) for s in stages]
        ax1.stackplot(steps, ys, labels=stages, alpha=0.85)
        means = [float(np.mean([r.get(f"time/{s}") or 0.0 for r in train])) for s in stages]
        order = np.argsort(means)
        ax2.barh([stages[i] for i in order], [means[i] for i in order], color="tab:blue")
        for i, idx in enumerate(order):
            ax2.text(means[idx], i, f" {means[idx]:.3g}", va="center", fontsize="small")
        ax2.margins(x=0.15)
    if total_steps:
        ax1.plot(total_steps, smooth(total, w), color="black", linewidth=1.2, label="time/step")
    _finish(ax1, "Stage time per step" + (f" (avg {w})" if w > 1 else ""), "step", "seconds")
    if ax1.get_legend():
        ax1.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4, fontsize="small", frameon=False)
    _finish(ax2, "Mean seconds per stage", "seconds", "")
    return fig


EXTRA_KEYS = [
    ("actor/pg_loss", "Policy loss"),
    ("critic/vf_loss", "Value loss"),
    ("actor/pg_clipfrac", "Clip fraction"),
    ("actor/grad_norm", "Grad norm"),
    ("actor/lr", "Learning rate"),
    ("perf/tokens_per_s", "Tokens/s"),
]


def plot_optimization(records: Sequence[Record], run: str) -> Figure | None:
    present = [(k, t) for k, t in EXTRA_KEYS if series(records, k)[0]]
    if not present:
        return None
    ncols = min(3, len(present))
    nrows = (len(present) + ncols - 1) // ncols
    fig = Figure(figsize=(5.0 * ncols, 3.6 * nrows), dpi=110, layout="constrained")
    fig.suptitle(f"Optimisation: {run}", fontweight="bold")
    axes = np.atleast_1d(fig.subplots(nrows, ncols)).ravel()
    for ax, (key, title) in zip(axes, present, strict=False):
        steps, values = series(records, key)
        _line(ax, steps, values, key, "tab:blue")
        _finish(ax, title, "step", key)
        if ax.get_legend():
            ax.get_legend().remove()
    for ax in axes[len(present) :]:
        ax.set_visible(False)
    return fig


PlotFn = Callable[[Sequence[Record], str], "Figure | None"]

PLOTS: dict[str, PlotFn] = {
    "reward": plot_reward,
    "val_accuracy": plot_val_accuracy,
    "kl": plot_kl,
    "entropy": plot_entropy,
    "response_length": plot_response_length,
    "timing": plot_timing,
    "optimization": plot_optimization,
}


def draw(fn: PlotFn, records: Sequence[Record], run: str, path: Path) -> bool:
    """Draw one plot under the shared style and save it as PNG; False when it had no data."""
    with style.context(STYLE):
        fig = fn(records, run)
        if fig is None:
            return False
        fig.savefig(path, format="png")
    return True
