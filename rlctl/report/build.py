"""Turn a run directory into plots, ``report.md`` (summary, plots, sample tables) and a ``Summary``."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlctl.report.reader import load_metrics
from rlctl.report.samples import samples_markdown
from rlctl.report.summary import Summary, summarize, summary_lines

PLOT_DIR = "plots"
REPORT_FILE = "report.md"


@dataclass
class Report:
    """What ``build_report`` produced: the summary, the PNG paths, the markdown path, and how
    many sample rows (from ``samples.jsonl``) its tables show."""

    run_dir: Path
    summary: Summary
    plots: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    markdown: Path | None = None
    sample_rows: int = 0
    samples_md: str = field(default="", repr=False)

    def to_dict(self) -> dict:
        return {
            "run_dir": str(self.run_dir),
            **self.summary.to_dict(),
            "plots": [str(p) for p in self.plots],
            "skipped_plots": self.skipped,
            "report": str(self.markdown) if self.markdown else None,
            "sample_rows": self.sample_rows,
        }


def _markdown(report: Report, md_path: Path) -> str:
    rows = "\n".join(f"| {label} | {text} |" for label, text in summary_lines(report.summary))
    images = "\n\n".join(
        f"![{p.stem}]({Path(os.path.relpath(p, md_path.parent)).as_posix()})" for p in report.plots
    )
    head = f"# rlctl report: {report.run_dir.name}\n\n| | |\n|---|---|\n{rows}\n\n{images}\n"
    return f"{head}\n{report.samples_md}" if report.samples_md else head


def build_report(
    run_dir: str | Path,
    out_dir: str | Path | None = None,
    threshold: float = 0.8,
    on_progress: Callable[[str], None] | None = None,
) -> Report:
    """Read ``RUN_DIR/metrics.jsonl``, write PNGs to ``out_dir`` (default ``RUN_DIR/plots``).

    ``report.md`` goes next to the plots' folder by default (``RUN_DIR/report.md``), inside
    ``out_dir`` when one is given. ``on_progress(name)`` is called before each plot is drawn.
    Raises ``UserError`` for a missing, empty or malformed metrics file.
    """
    from rlctl.report import plots  # matplotlib is imported only once the input is known good

    run_dir = Path(run_dir)
    records = load_metrics(run_dir)
    report = Report(run_dir=run_dir, summary=summarize(records, threshold))
    out = Path(out_dir) if out_dir is not None else run_dir / PLOT_DIR
    out.mkdir(parents=True, exist_ok=True)
    run_name = run_dir.resolve().name
    for name, fn in plots.PLOTS.items():
        if on_progress is not None:
            on_progress(name)
        if name == "val_accuracy":
            fn = functools.partial(plots.plot_val_accuracy, threshold=threshold)
        path = out / f"{name}.png"
        if plots.draw(fn, records, run_name, path):
            report.plots.append(path)
        else:
            report.skipped.append(name)
            path.unlink(missing_ok=True)  # no stale plot from an earlier report of this run
    report.samples_md, report.sample_rows = samples_markdown(run_dir)
    md_path = (out if out_dir is not None else run_dir) / REPORT_FILE
    md_path.write_text(_markdown(report, md_path), encoding="utf-8")
    report.markdown = md_path
    return report
