"""Code-execution reward: run the response's Python in the sandbox against the row's tests.

The program is the last fenced ```python block of the response, or the whole response when it
has none. Ground truth is one of:
- a string: test code (e.g. ``assert f(2) == 4``) run after the program;
- ``{"tests": str}``: the same;
- ``{"inputs": [str, ...], "outputs": [str, ...]}``: stdin/stdout cases, compared line by line
  with trailing whitespace ignored (as much stdout is read back as the expected output needs,
  up to ``max_file_mb``).
Score 1.0 iff every case passes within the sandbox limits; timeouts are reported. Test code
runs in a judge process of its own that calls the program's process over a pipe and gets back
plain data only (``sandbox_verdict.py``): it passes only when the judge *witnessed* the tests run
to their last statement (``SandboxResult.witnessed``). A program that exits early
(``os._exit(0)``, ``SystemExit``, a forked child, a closed stdout), prints a fake success line,
reads the tests, walks frames, rebinds builtins or returns an object equal to everything scores
0: none of that reaches the judge. What remains is what any test suite leaves: a program that
special-cases the inputs it is tested on, and tests that do not check what they mean to.
A sandbox that
refuses to run (a required layer missing) or fails to start raises ``RunError``: that is the
host's fault, not the response's, and must not be trained on as a zero.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rlctl.errors import RunError
from rlctl.rewards.sandbox import SandboxLimits, SandboxResult, run_python

FENCE = "```"


def extract_code(solution_str: str) -> str:
    """The last fenced code block of the response, else the response itself.

    A block opens with a fence (any info string up to the end of its line) and ends at the next
    fence. One linear scan: a regex here backtracked quadratically on a run of backticks with no
    newline (80k backticks took 4 s of the driver's reward threads).
    """
    blocks, pos = [], 0
    while (start := solution_str.find(FENCE, pos)) >= 0:
        newline = solution_str.find("\n", start + len(FENCE))
        if newline < 0:
            break
        end = solution_str.find(FENCE, newline + 1)
        if end < 0:
            break
        blocks.append(solution_str[newline + 1 : end])
        pos = end + len(FENCE)
    return blocks[-1] if blocks else solution_str


def _same_output(got: str, want: str) -> bool:
    return [ln.rstrip() for ln in got.strip().splitlines()] == [
        ln.rstrip() for ln in want.strip().splitlines()
    ]


def _room_for(limits: SandboxLimits, want: str) -> SandboxLimits:
    """``limits`` with enough stdout read back to hold the expected output (twice it, 4 KiB more),
    up to the file-size limit: a correct program with a long answer must be able to pass."""
    need = 2 * len(want.encode("utf-8")) + 4096
    room = min(max(limits.max_output_bytes, need), limits.max_file_mb << 20)
    return limits if room == limits.max_output_bytes else replace(limits, max_output_bytes=room)


def _checked(res: SandboxResult) -> SandboxResult:
    """The result, or RunError when the sandbox itself refused or failed (not the response's fault)."""
    if res.error is not None:
        raise RunError(res.error)
    return res


def code_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    limits: SandboxLimits | None = None,
) -> dict[str, Any]:
    """``{"score", "acc", "passed", "total", "timed_out"}`` of the response's program."""
    code = extract_code(solution_str)
    if isinstance(ground_truth, dict) and "tests" in ground_truth:
        ground_truth = ground_truth["tests"]
    if isinstance(ground_truth, str):
        res = _checked(run_python(code, tests=ground_truth, limits=limits))
        passed = int(res.ok and res.witnessed)
        return {
            "score": float(passed),
            "acc": float(passed),
            "passed": passed,
            "total": 1,
            "timed_out": res.timed_out,
        }
    if not isinstance(ground_truth, dict) or "inputs" not in ground_truth or "outputs" not in ground_truth:
        raise ValueError("code ground_truth must be test code or {'inputs': [...], 'outputs': [...]}")
    cases = list(zip(ground_truth["inputs"], ground_truth["outputs"], strict=True))
    passed, timed_out = 0, False
    for stdin, want in cases:
        case_limits = _room_for(limits or SandboxLimits(), str(want))
        res = _checked(run_python(code, stdin=str(stdin), limits=case_limits))
        timed_out = timed_out or res.timed_out
        if not res.ok or not _same_output(res.stdout, str(want)):
            break  # all-or-nothing: later cases cannot change the score
        passed += 1
    ok = float(passed == len(cases) and bool(cases))
    return {"score": ok, "acc": ok, "passed": passed, "total": len(cases), "timed_out": timed_out}
