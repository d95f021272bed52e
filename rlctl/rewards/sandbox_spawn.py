"""Starting the sandbox launcher on a run's config, stopping it past its time, reading its files."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

LAUNCHER = Path(__file__).with_name("sandbox_launch.py")
_KILL_GRACE_S = 5.0  # how long the launcher gets to reap a killed namespace before it is killed too


def read_head(path: Path, limit: int) -> str:
    with path.open("rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _stop(launcher: subprocess.Popen, io_dir: Path) -> None:
    """Kill a run that is past its time: its pid-namespace init (which takes the rest), then the launcher."""
    with contextlib.suppress(OSError, ValueError):
        if not (io_dir / "status.json").exists():  # the launcher has not reaped its child: the pid is valid
            os.kill(int((io_dir / "init_pid").read_text()), signal.SIGKILL)
    try:
        launcher.wait(timeout=_KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def launch(io_dir: Path, timeout_s: float) -> tuple[dict, bool]:
    """Start the launcher on the run's config; its ``status.json`` and whether it timed out."""
    with (
        (io_dir / "stdin").open("rb") as fin,
        (io_dir / "stdout").open("wb") as fout,
        (io_dir / "stderr").open("wb") as ferr,
    ):
        try:
            launcher = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", str(LAUNCHER), str(io_dir / "config.json")],
                cwd=io_dir,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                stdin=fin,
                stdout=fout,
                stderr=ferr,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            return {"error": f"start failed: {exc}"}, False
        timed_out = False
        try:
            launcher.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(launcher, io_dir)
    return read_json(io_dir / "status.json"), timed_out
