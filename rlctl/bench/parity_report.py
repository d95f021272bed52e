"""Rendering of parity reports: the per-dtype table, the log-prob difference histogram, ``--compare``.

The report is a list of cases (:func:`rlctl.bench.parity.run_case`); these functions only read it.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlctl.errors import UserError

LABELS = {
    "train_log_probs": "train log-probs",
    "train_entropy": "train entropy",
    "loss": "loss",
    "grad_norms": "grad norms (per layer)",
    "optimizer_step": "optimiser step",
    "rollout_log_probs": "rollout log-probs",
    "train_vs_rollout_gap": "train-vs-rollout gap",
}


def judged_value(q: dict) -> float | None:
    on = q.get("judged_on")
    return None if on is None else q.get(on)


def rows(report: list[dict]) -> list[dict]:
    """One flat row per (case, dtype, quantity): what the tables print."""
    out = []
    for case in report:
        for result in case["results"]:
            for key, q in result["quantities"].items():
                out.append(
                    {
                        "model": case["case"]["name"],
                        "device": case["case"]["device"],
                        "dtype": result["dtype"],
                        "quantity": key,
                        "judged_on": q.get("judged_on", "-"),
                        "value": judged_value(q),
                        "max_abs": q.get("max_abs", q.get("max")),
                        "mean_abs": q.get("mean_abs", q.get("mean")),
                        "max_rel": q.get("max_rel"),
                        "mean_rel": q.get("mean_rel"),
                        "p99": q.get("p99"),
                        "pass_below": (q.get("tolerance") or {}).get("passes"),
                        "verdict": q["verdict"],
                    }
                )
    return out


def _g(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def render(report: list[dict]) -> None:
    """Rich tables: one per case, a row per quantity and dtype, and each dtype's verdict."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for case in report:
        c, env = case["case"], case["environment"]
        table = Table(
            title=(
                f"parity: {c['name']} on {c['device']} ({env['device_name']}), attention "
                f"{c['attn_implementation']}, rollout {c['rollout_engine']}; reference: CPU float64"
            )
        )
        for col in ("dtype", "quantity", "error (judged on)", "PASS <=", "max abs", "max rel", "verdict"):
            table.add_column(col, justify="left" if col in ("dtype", "quantity") else "right")
        for r in rows([case]):
            table.add_row(
                r["dtype"],
                LABELS.get(r["quantity"], r["quantity"]),
                f"{_g(r['value'])} ({r['judged_on']})",
                _g(r["pass_below"]),
                _g(r["max_abs"]),
                _g(r["max_rel"]),
                r["verdict"],
            )
        console.print(table)
        for result in case["results"]:
            gap = result["quantities"]["train_vs_rollout_gap"]
            failing = (
                f" (FAIL: {', '.join(LABELS[k] for k in result['failing'])})" if result["failing"] else ""
            )
            console.print(
                f"{c['name']} {result['dtype']}: {result['verdict']}{failing}; train-vs-rollout gap mean "
                f"{_g(gap.get('mean'))}, p99 {_g(gap.get('p99'))}, max {_g(gap.get('max'))} nats over "
                f"{result['tokens']} tokens; {result['seconds']:.1f} s"
            )


def histogram(report: list[dict], path: Path) -> Path:
    """PNG: per-token log-prob differences against float64, one panel per case, one series per
    dtype and side (train engine, rollout engine), symmetric log x axis."""
    import numpy as np
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5 * len(report), 4.2), layout="constrained")
    axes = fig.subplots(1, len(report), squeeze=False)[0]
    for ax, case in zip(axes, report, strict=True):
        series = [
            (f"{r['dtype']} {side}", np.asarray(values))
            for r in case["results"]
            for side, values in r["log_prob_diffs"].items()
            if values
        ]
        top = max((float(np.abs(v).max()) for _, v in series), default=1.0) or 1.0
        tiny = min((float(np.abs(v[v != 0]).min()) for _, v in series if np.any(v != 0)), default=top * 1e-6)
        edges = np.geomspace(max(tiny, top * 1e-9), top * 1.01, 41)
        bins = np.concatenate([-edges[::-1], edges])
        for label, values in series:
            ax.hist(values, bins=bins, histtype="step", label=label, linewidth=1.4)
        ax.set_xscale("symlog", linthresh=float(edges[0]))
        decades = range(int(np.ceil(np.log10(edges[0]))), int(np.ceil(np.log10(edges[-1]))) + 1)
        shown = [10.0**k for k in decades][::-2][::-1]  # every other decade, the largest always
        ax.set_xticks([-x for x in shown[::-1]] + [0.0] + shown)
        ax.set_xlabel("log-prob - float64 reference (nats)")
        ax.set_ylabel("tokens")
        ax.set_title(f"{case['case']['name']} on {case['case']['device']}")
        ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def load(path: str | Path) -> list[dict]:
    """A saved ``--json`` report; UserError names the file and what is wrong with it."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a readable parity report ({exc})") from None
    cases = data.get("cases") if isinstance(data, dict) else None
    if not isinstance(cases, list) or not all(isinstance(c, dict) and "results" in c for c in cases):
        raise UserError(f"{path}: expected the JSON of `rlctl bench parity --json` (a 'cases' list)")
    return cases


def compare(a: list[dict], b: list[dict]) -> list[dict]:
    """Rows of two reports side by side, matched on (model, dtype, quantity)."""
    left = {(r["model"], r["dtype"], r["quantity"]): r for r in rows(a)}
    right = {(r["model"], r["dtype"], r["quantity"]): r for r in rows(b)}
    keys = list(left) + [k for k in right if k not in left]
    return [
        {
            "model": k[0],
            "dtype": k[1],
            "quantity": k[2],
            "judged_on": (left.get(k) or right.get(k))["judged_on"],
            "a": (left.get(k) or {}).get("value"),
            "a_verdict": (left.get(k) or {}).get("verdict", "-"),
            "b": (right.get(k) or {}).get("value"),
            "b_verdict": (right.get(k) or {}).get("verdict", "-"),
        }
        for k in keys
    ]


def render_compare(a: list[dict], b: list[dict], names: tuple[str, str]) -> None:
    from rich.console import Console
    from rich.table import Table

    def machine(report):
        env = report[0]["environment"] if report else {}
        return f"{env.get('device_name', '?')} ({env.get('device', '?')})"

    table = Table(title=f"parity side by side: A = {names[0]}: {machine(a)}; B = {names[1]}: {machine(b)}")
    for col in ("model", "dtype", "quantity", "judged on", "A", "A verdict", "B", "B verdict"):
        table.add_column(col)
    for r in compare(a, b):
        table.add_row(
            r["model"],
            r["dtype"],
            LABELS.get(r["quantity"], r["quantity"]),
            r["judged_on"],
            _g(r["a"]),
            r["a_verdict"],
            _g(r["b"]),
            r["b_verdict"],
        )
    Console().print(table)
