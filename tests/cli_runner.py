"""Run the real ``rlctl`` entry point in-process and capture exit code, stdout and stderr."""

from __future__ import annotations

import contextlib
import io

from rlctl.cli.main import main


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()
