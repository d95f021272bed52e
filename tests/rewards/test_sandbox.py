"""Sandboxed code execution: hostile snippets are contained and score 0; a normal one scores 1.

CI runs as root, so each test is bounded by pytest-timeout, and the fork bomb runs only when the
sandbox reports a process limit that binds (a pids cgroup or an unprivileged uid).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from rlctl.rewards.code import code_score, extract_code
from rlctl.rewards.manager import build_reward_manager
from rlctl.rewards.sandbox import SandboxLimits, run_python, sandbox_plan

pytestmark = pytest.mark.timeout(90)
PRINTS_OK = {"inputs": [""], "outputs": ["ok"]}
PLAN = sandbox_plan()
needs_python = pytest.mark.skipif(PLAN.python is None, reason="no interpreter runs in the sandbox here")


def _live_processes_of(uid: int) -> list[int]:
    """Pids of non-zombie processes owned by ``uid``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
            pids.append(int(entry.name))
    return pids


@needs_python
def test_normal_snippet_scores_one():
    solution = "Here it is:\n```python\ndef double(x):\n    return 2 * x\n```\n"
    assert code_score("code", solution, "assert double(21) == 42")["score"] == 1.0
    assert code_score("code", solution, "assert double(21) == 41")["score"] == 0.0
    echo = "import sys\nprint(int(sys.stdin.read()) + 1)"
    out = code_score("code", echo, {"inputs": ["1", "41"], "outputs": ["2", "42"]})
    assert out == {"score": 1.0, "acc": 1.0, "passed": 2, "total": 2, "timed_out": False}
    assert code_score("code", echo, {"inputs": ["1", "41"], "outputs": ["2", "43"]})["score"] == 0.0


def test_extract_code_takes_the_last_fenced_block():
    assert extract_code("a\n```python\nx=1\n```\nb\n```py\nx=2\n```") == "x=2\n"
    assert extract_code("print(1)") == "print(1)"


@needs_python
def test_clean_environment_and_scratch_cwd(monkeypatch):
    monkeypatch.setenv("RLCTL_SECRET_TOKEN", "hunter2")
    res = run_python("import os, sys\nprint(sorted(os.environ))\nprint(os.getcwd() == os.environ['HOME'])")
    assert res.ok, res.stderr
    env_line, same = res.stdout.splitlines()
    assert env_line == "['HOME', 'LANG', 'PATH', 'TMPDIR']" and same == "True"
    if os.geteuid() == 0:
        assert res.uid is not None and res.uid != 0


@needs_python
def test_scratch_directory_is_removed_and_writable():
    res = run_python("import os\nopen('f.txt', 'w').write('x')\nprint(os.getcwd())")
    assert res.ok, res.stderr
    assert not Path(res.stdout.strip()).exists()


@needs_python
def test_infinite_loop_times_out_and_scores_zero():
    limits = SandboxLimits(timeout_s=1.0)
    out = code_score("code", "while True:\n    pass\nprint('ok')", PRINTS_OK, limits=limits)
    assert out["score"] == 0.0 and out["timed_out"] is True
    res = run_python("import time\ntime.sleep(60)", limits=limits)  # wall clock, not CPU time
    assert res.timed_out and not res.ok


@needs_python
@pytest.mark.parametrize("guard", [True, False])
def test_large_allocation_fails_and_scores_zero(guard):
    limits = SandboxLimits(memory_mb=256, guard=guard)
    snippet = "x = bytearray(2 * 1024**3)\nprint('ok')"
    assert code_score("code", snippet, PRINTS_OK, limits=limits)["score"] == 0.0
    assert "MemoryError" in run_python(snippet, limits=limits).stderr


@needs_python
@pytest.mark.timeout(60)
@pytest.mark.skipif(not PLAN.process_limit, reason="no process limit binds here (root, no cgroup)")
def test_process_count_is_limited():
    spawn = (
        "import os, time\nn = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
        "    n += 1\nprint(n)\n"
    )
    res = run_python(spawn, limits=SandboxLimits(timeout_s=5, max_processes=16))
    assert res.ok, res.stderr
    assert int(res.stdout) < 16
    if res.uid is not None:
        assert _live_processes_of(res.uid) == []  # the sleeping children were killed


@needs_python
@pytest.mark.timeout(60)
@pytest.mark.skipif(not PLAN.process_limit, reason="no process limit binds here (root, no cgroup)")
def test_fork_bomb_is_contained_and_scores_zero():
    bomb = "import os\nwhile True:\n    os.fork()\nprint('ok')"
    limits = SandboxLimits(timeout_s=3, max_processes=16)
    res = run_python(bomb, limits=limits)
    assert not res.ok
    if res.uid is not None:
        assert _live_processes_of(res.uid) == []
    assert code_score("code", bomb, PRINTS_OK, limits=limits)["score"] == 0.0
    assert run_python("print('ok')").ok  # the sandbox still works afterwards


@needs_python
def test_write_outside_scratch_is_refused_by_the_guard(tmp_path):
    targets = [tmp_path / "pwned.txt", Path(f"/tmp/rlctl-sbx-test-{uuid.uuid4().hex}.txt")]
    warm_up = "import os\nfor i in range(50):\n    open(f'f{i}.txt', 'w').write('x')\n    os.listdir('.')\n"
    for target in targets:
        snippet = f"{warm_up}open({str(target)!r}, 'w').write('x')\nprint('ok')"
        assert code_score("code", snippet, PRINTS_OK)["score"] == 0.0
        assert not target.exists()
        rm = f"import os\nos.remove({str(tmp_path / 'keep.txt')!r})\nprint('ok')"
        (tmp_path / "keep.txt").write_text("x")
        assert code_score("code", rm, PRINTS_OK)["score"] == 0.0
        assert (tmp_path / "keep.txt").exists()
        sh = f"import os\nos.system('echo x > {target}')\nprint('ok')"
        assert code_score("code", sh, PRINTS_OK)["score"] == 0.0
        assert not target.exists()


@needs_python
def test_guard_holds_in_threads(tmp_path):
    target = Path(f"/tmp/rlctl-sbx-test-{uuid.uuid4().hex}.txt")
    snippet = (
        "import threading\nerrors = []\n"
        "def work():\n    for _ in range(200):\n        try:\n"
        f"            open({str(target)!r}, 'w').write('x')\n"
        "        except PermissionError:\n            errors.append(1)\n"
        "ts = [threading.Thread(target=work) for _ in range(4)]\n"
        "[t.start() for t in ts]\n[t.join() for t in ts]\nprint(len(errors))\n"
    )
    res = run_python(snippet)
    assert res.ok, res.stderr
    assert res.stdout.strip() == "800" and not target.exists()


@needs_python
@pytest.mark.parametrize(
    "snippet",
    [
        "import subprocess",
        "import _posixsubprocess",
        "import ctypes",
        "import os\nos.execv('/bin/true', ['true'])",
    ],
)
def test_guard_refuses_starting_programs_and_ctypes(snippet):
    res = run_python(snippet)
    assert not res.ok and "PermissionError: sandbox:" in res.stderr


@needs_python
@pytest.mark.skipif(PLAN.uid is None, reason="privileges are only dropped when running as root")
def test_write_outside_scratch_is_refused_by_the_os(tmp_path):
    os.chmod(tmp_path, 0o755)  # readable, not writable, by others
    target = tmp_path / "pwned.txt"
    snippet = f"open({str(target)!r}, 'w').write('x')\nprint('ok')"
    res = run_python(snippet, limits=SandboxLimits(guard=False))
    assert not res.ok and "PermissionError" in res.stderr
    assert not target.exists()


@pytest.fixture
def tcp_server():
    """A local TCP server that records whether anyone connected."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    hits: list[str] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            hits.append("connected")
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], hits
    stop.set()
    t.join(2)
    srv.close()


@needs_python
@pytest.mark.parametrize("guard", [True, False])
def test_socket_connect_fails_and_scores_zero(tcp_server, guard):
    if not guard and not PLAN.netns:
        pytest.skip("no network namespace here; only the guard blocks sockets")
    port, hits = tcp_server
    # the server is reachable from outside the sandbox
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    for _ in range(200):  # wait until the server has recorded this connection, then forget it
        if hits:
            break
        time.sleep(0.01)
    assert hits == ["connected"]
    hits.clear()
    snippet = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('ok')"
    limits = SandboxLimits(guard=guard)
    assert code_score("code", snippet, PRINTS_OK, limits=limits)["score"] == 0.0
    res = run_python(snippet, limits=limits)
    assert not res.ok and (
        "PermissionError" in res.stderr or "OSError" in res.stderr or "Error" in res.stderr
    )
    assert hits == []


@needs_python
def test_reward_manager_counts_sandbox_timeouts():
    mgr = build_reward_manager("code", sandbox=SandboxLimits(timeout_s=1.0))
    snippets = ["print('ok')", "while True:\n    pass", "raise SystemExit(3)", "print('ok')"]
    out = mgr.score(["code"] * 4, snippets, [PRINTS_OK] * 4)
    assert out.scores == [1.0, 0.0, 0.0, 1.0]
    assert out.metrics["reward/timeouts"] == 1.0 and out.metrics["reward/errors"] == 0.0
    assert out.acc == [1.0, 0.0, 0.0, 1.0]
