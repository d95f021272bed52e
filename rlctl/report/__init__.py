"""``rlctl report``: plots and a summary of a run directory's ``metrics.jsonl``."""

from __future__ import annotations

from rlctl.report.build import Report, build_report
from rlctl.report.reader import load_metrics
from rlctl.report.summary import Summary, summarize, summary_text

__all__ = ["Report", "Summary", "build_report", "load_metrics", "summarize", "summary_text"]
