"""Sandboxed code execution: a normal snippet scores 1, limits hold, and missing layers are refused.

The hostile-snippet corpus is in test_sandbox_hostile.py. Every test is bounded by pytest-timeout;
where this host lacks a layer ``strict`` needs, the tests that run snippets assert the refusal.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from rlctl.errors import RunError, UserError
from rlctl.rewards import sandbox as sandbox_mod
from rlctl.rewards.code import code_score, extract_code
from rlctl.rewards.manager import build_reward_manager
from rlctl.rewards.sandbox import SandboxLimits, live_pids_of_uid, require_sandbox, run_python
from rlctl.rewards.sandbox_layers import MEMORY, MOUNT, NET, PID, SECCOMP, refusal
from tests.rewards.sandbox_host import PLAN, REFUSED, REQUIRED

pytestmark = pytest.mark.timeout(90)
PRINTS_OK = {"inputs": [""], "outputs": ["ok"]}
needs_python = pytest.mark.skipif(
    REFUSED is not None and not REQUIRED, reason=f"strict refuses here: {REFUSED}"
)
_live_processes_of = live_pids_of_uid


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
    name = f"rlctl-sbx-test-{uuid.uuid4().hex}.txt"
    res = run_python(f"import os\nopen('{name}', 'w').write('x')\nopen('/tmp/a{name}', 'w').write('x')\n"
                     "print(os.getcwd(), len(os.listdir('.')))")  # fmt: skip
    assert res.ok, res.stderr
    cwd, count = res.stdout.split()
    assert count == "4"  # the snippet, the guard and its two files: a fresh private scratch
    assert not (Path(cwd) / name).exists() and not Path(f"/tmp/a{name}").exists()


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
    targets = [Path(f"/etc/rlctl-sbx-test-{uuid.uuid4().hex}.txt"), Path(f"/usr/rlctl-{uuid.uuid4().hex}")]
    warm_up = "import os\nfor i in range(50):\n    open(f'f{i}.txt', 'w').write('x')\n    os.listdir('.')\n"
    for target in targets:
        snippet = f"{warm_up}open({str(target)!r}, 'w').write('x')\nprint('ok')"
        assert code_score("code", snippet, PRINTS_OK)["score"] == 0.0
        assert "sandbox: writing outside the scratch directory" in run_python(snippet).stderr
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
    target = Path(f"/etc/rlctl-sbx-test-{uuid.uuid4().hex}.txt")
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
    assert not res.ok and ("PermissionError" in res.stderr or "FileNotFoundError" in res.stderr)
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


SETSID_GRANDCHILD = (
    "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(20)\n"
    "    os._exit(0)\ntime.sleep(0.3)\nprint('ok')\n"
)


def _without(plan, *layers):
    keys = {PID: "pidns", MOUNT: "mountns", NET: "netns", SECCOMP: "seccomp", MEMORY: "memory_cgroup"}
    why = {name: "unshare: Operation not permitted" for name in layers}
    return replace(
        plan, missing_why=why, **{keys[name]: None if name == MEMORY else False for name in layers}
    )


@pytest.mark.parametrize("layer", [PID, MOUNT, NET, SECCOMP, MEMORY])
def test_strict_refuses_when_a_layer_is_missing(monkeypatch, layer):
    """A host without a layer: nothing runs; start and run time say which layer, in one line."""
    plan = _without(replace(PLAN, python=PLAN.python or "/usr/bin/python3", pidns=True, mountns=True, netns=True,
                            uid=PLAN.uid if os.geteuid() else 65534, userns=os.geteuid() != 0, seccomp=True,
                            memory_cgroup=("/sys/fs/cgroup/memory", "memory.limit_in_bytes")), layer)  # fmt: skip
    monkeypatch.setattr(sandbox_mod, "sandbox_plan", lambda user="nobody": plan)
    monkeypatch.setattr(sandbox_mod, "_run", lambda *a: pytest.fail("a snippet ran without a required layer"))
    with pytest.raises(UserError) as exc:
        require_sandbox("strict")
    msg = str(exc.value)
    assert "\n" not in msg and f"needs the {layer} layer" in msg and "reward.sandbox = 'best-effort'" in msg
    res = run_python("print('ok')")
    assert not res.ok and res.error == f"sandbox refused: {msg}"
    with pytest.raises(RunError, match=f"needs the {layer} layer"):  # not a silent zero
        code_score("code", "print('ok')", PRINTS_OK)
    assert [lay.name for lay in plan.layers() if not lay.active] == [layer]
    with pytest.raises(UserError, match="expected one of strict, best-effort"):
        require_sandbox("loose")


def test_no_interpreter_is_refused_at_every_level(monkeypatch):
    plan = replace(PLAN, python=None, missing_why={"interpreter": "exit 126"})
    monkeypatch.setattr(sandbox_mod, "sandbox_plan", lambda user="nobody": plan)
    for level in ("strict", "best-effort"):
        with pytest.raises(UserError, match="no Python interpreter starts in the sandbox"):
            require_sandbox(level)


def _uid_python(plan):
    """An interpreter the pool uid can run without the mount namespace's view, or None."""
    for exe in ("/usr/bin/python3", "/usr/local/bin/python3"):
        p = replace(plan, python=exe, pidns=False, mountns=False, pids_cgroup=None)
        if os.path.exists(exe) and sandbox_mod._try(p) is None:
            return p
    return None


@pytest.mark.timeout(60)
@pytest.mark.skipif(os.geteuid() != 0 or PLAN.uid is None, reason="per-run uids need root")
def test_best_effort_without_pid_namespace_kills_every_process_of_the_run_uid(monkeypatch):
    """No pid namespace and no pids cgroup: a setsid() grandchild is found by its uid and killed."""
    plan = _uid_python(PLAN)
    if plan is None:
        pytest.skip("no interpreter the sandbox uid can run outside the mount namespace")
    monkeypatch.setattr(sandbox_mod, "sandbox_plan", lambda user="nobody": plan)
    assert refusal(plan, "strict") is not None and refusal(plan, "best-effort") is None
    assert run_python(SETSID_GRANDCHILD).error.startswith("sandbox refused:")
    res = run_python(SETSID_GRANDCHILD, limits=SandboxLimits(level="best-effort"))
    assert res.ok and res.stdout == "ok\n", res.stderr
    assert res.uid is not None and live_pids_of_uid(res.uid) == []  # today: the grandchild lived on


@needs_python
def test_setsid_grandchild_dies_with_the_pid_namespace():
    res = run_python(SETSID_GRANDCHILD)
    assert res.ok and res.stdout == "ok\n", res.stderr
    assert live_pids_of_uid(res.uid) == []


@needs_python
def test_snippet_is_init_of_its_own_namespaces():
    res = run_python(
        "import os, socket\nprint(os.getpid(), os.getppid(), sorted(os.listdir('/')))\n"
        "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
        "print(sorted(os.listdir('/sys/class/net')) if os.path.exists('/sys/class/net') else ['lo'])\n"
    )
    assert res.ok, res.stderr
    ids, procs, _ = res.stdout.splitlines()
    pid, ppid, *_ = ids.split()
    assert (pid, ppid) == ("1", "0") and procs == "['1']"
    assert "home" not in ids and "work" not in ids and "root" not in ids.replace("'root'", "")


def test_process_limit_reports_only_limits_that_bind():
    """Root without a dropped uid and without a pids cgroup: no process limit, and doctor says so."""
    root_plan = replace(PLAN, uid=None, userns=False, pids_cgroup=None)
    if os.geteuid() == 0:
        assert not root_plan.process_limit
        assert not next(lay for lay in root_plan.layers() if lay.name == "process limit").active
    assert replace(PLAN, pids_cgroup=("/sys/fs/cgroup/pids", "pids.max")).process_limit


def test_doctor_reports_each_layer(monkeypatch):
    from rlctl.doctor.checks_sandbox import check_sandbox
    from rlctl.verdict import Verdict

    rows = {r.name: r for r in check_sandbox()}
    names = ["pid namespace", "mount namespace", "network namespace", "unprivileged uid", "seccomp filter",
             "memory cgroup", "process limit"]  # fmt: skip
    assert [f"sandbox:{n}" for n in names] == list(rows)[:7]
    for lay in PLAN.layers():
        assert rows[f"sandbox:{lay.name}"].verdict is (Verdict.PASS if lay.active else Verdict.WARN)
    plan = _without(PLAN, NET)
    monkeypatch.setattr(sandbox_mod, "sandbox_plan", lambda user="nobody": plan)
    net = {r.name: r for r in check_sandbox()}["sandbox:network namespace"]
    assert net.verdict is Verdict.WARN and "refuse to run at reward.sandbox = 'strict'" in net.reason
    assert "best-effort" in net.fix
    monkeypatch.setattr(sandbox_mod, "sandbox_plan", lambda user="nobody": replace(PLAN, python=None))
    assert [r.verdict for r in check_sandbox()] == [Verdict.FAIL]


def test_code_profile_fails_at_load_naming_the_missing_layer(monkeypatch):
    from rlctl.profile.loader import load_profile

    plan = _without(replace(PLAN, python=PLAN.python or "/usr/bin/python3"), PID)
    monkeypatch.setattr(sandbox_mod, "sandbox_plan", lambda user="nobody": plan)
    with pytest.raises(UserError) as exc:
        load_profile("profiles/tiny-cpu.toml", ["reward.kind=code"])
    msg = str(exc.value)
    assert "reward.sandbox: 'strict' needs the pid namespace layer" in msg and "\n" not in msg
    if refusal(replace(plan, pidns=True), "strict") is None:  # the other layers are here
        load_profile("profiles/tiny-cpu.toml", ["reward.kind=code", "reward.sandbox=best-effort"])
