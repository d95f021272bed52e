"""A corpus of hostile snippets: each is contained and scores 0, for a stated reason.

Every snippet prints ``ok`` only if its attack seemed to work, and is scored against ``ok``; the
test asserts the score, the reason the run gives (``SandboxResult.reason``) and, on the host, that
nothing changed and no process of the run survives. Targets on the host are tmp paths only.
Cases marked ``os_only`` also run with the audit guard off, to show the OS layers hold alone.
Where this host lacks a layer ``strict`` needs, each case asserts the refusal instead (and fails
under ``RLCTL_TEST_REQUIRE_SANDBOX=1``, as in CI).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import uuid
from pathlib import Path

import pytest

from rlctl.rewards.code import code_score
from rlctl.rewards.sandbox import SandboxLimits, live_pids_of_uid, run_python
from tests.rewards.sandbox_host import refused_here, require_strict

pytestmark = pytest.mark.timeout(60)
PRINTS_OK = {"inputs": [""], "outputs": ["ok"]}


@pytest.fixture
def host(tmp_path, monkeypatch):
    """Host-side victims: a fake $HOME and run directory with files, and a unix socket server."""
    home = tmp_path / "home"
    run_dir = tmp_path / "runs" / "exp1"
    for d in (home, run_dir):
        d.mkdir(parents=True)
        os.chmod(d, 0o755)
    os.chmod(tmp_path, 0o755)
    os.chmod(tmp_path.parent, 0o755)
    (home / ".bashrc").write_text("safe\n")
    (run_dir / "secret.txt").write_text("s3cret\n")
    os.chmod(run_dir / "secret.txt", 0o644)
    monkeypatch.setenv("HOME", str(home))
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(tmp_path / "ctl.sock"))
    os.chmod(tmp_path / "ctl.sock", 0o777)
    abstract = f"\0rlctl-test-{uuid.uuid4().hex}"
    asrv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    asrv.bind(abstract)
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    for s in (srv, asrv, tcp):
        s.listen(4)
        s.setblocking(False)
    victim_tmp = Path(f"/tmp/rlctl-hostile-{uuid.uuid4().hex}.txt")
    victim_tmp.write_text("safe\n")
    hits: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda *_: hits.append(1))
    yield {
        "HOME": str(home),
        "RUN": str(run_dir),
        "UNIX": str(tmp_path / "ctl.sock"),
        "ABSTRACT": abstract,
        "PORT": tcp.getsockname()[1],
        "TMPVICTIM": str(victim_tmp),
        "TMPNEW": f"/tmp/rlctl-hostile-new-{uuid.uuid4().hex}.txt",
        "PID": os.getpid(),
        "_servers": (srv, asrv, tcp),
        "_hits": hits,
    }
    signal.signal(signal.SIGUSR1, old)
    for s in (srv, asrv, tcp):
        for _ in range(8):  # nobody got through
            try:
                s.accept()
            except BlockingIOError:
                break
            else:
                raise AssertionError("a snippet connected to a host socket")
        s.close()
    assert (home / ".bashrc").read_text() == "safe\n" and sorted(os.listdir(home)) == [".bashrc"]
    assert (run_dir / "secret.txt").read_text() == "s3cret\n"
    assert victim_tmp.read_text() == "safe\n"
    victim_tmp.unlink()
    assert hits == [], "a snippet signalled the test process"


FRAME_WALK = """
import sys, os, socket
f = sys._getframe()
while f is not None:  # today's attack: flip the guard's re-entrancy flag; also rebind what it uses
    g = f.f_globals
    if "_local" in g:
        g["_local"].busy = True
    for k in ("_SCRATCH", "_DENIED_PREFIXES", "_inside", "_hook"):
        if k in g:
            g[k] = "/" if k == "_SCRATCH" else (() if k == "_DENIED_PREFIXES" else (lambda *a: True))
    f = f.f_back
os.path.realpath = lambda p, **k: os.getcwd()
import builtins
builtins.isinstance = lambda *a: False
open("/etc/rlctl-pwned", "a").write("pwned")
print("ok")
"""
FRAME_WALK_SOCKET = FRAME_WALK.replace("builtins.isinstance = lambda *a: False", "").replace(
    'open("/etc/rlctl-pwned", "a").write("pwned")', 'socket.socket().connect(("127.0.0.1", {PORT}))'
)
PARENT = """
import os, signal
ppid = os.getppid()
if ppid <= 1:
    raise ProcessLookupError(f"parent not visible (getppid() = {{ppid}})")
os.kill(ppid, signal.SIGKILL)
print("ok")
"""
SETSID_GRANDCHILD = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(1.5)
        print("ok", flush=True)
    os._exit(0)
time.sleep(0.2)
"""
FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
NETLINK = """
import socket, struct, os
s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
s.bind((0, 0))
ifi = struct.pack("BxHiII", 0, 0, 1, 1, 1)  # bring interface 1 (lo) up
s.send(struct.pack("IHHII", 16 + len(ifi), 16, 0x5, 1, 0) + ifi)  # RTM_NEWLINK, REQUEST|ACK
err = struct.unpack("i", s.recv(4096)[16:20])[0]
if err:
    raise OSError(-err, os.strerror(-err))
print("ok")
"""
CTYPES = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
if libc.setuid(0) != 0:
    raise PermissionError(ctypes.get_errno(), "setuid(0) refused")
print("ok")
"""

# name, snippet, reason substring with the guard, reason substring with the OS layers alone (None:
# not run without the guard), limits
CASES = [
    ("frame walk to the guard's globals", FRAME_WALK, "sandbox: writing outside", "Read-only file system", {}),
    ("frame walk then connect", FRAME_WALK_SOCKET, "sandbox: socket.connect is not allowed",
     "Network is unreachable", {}),
    # exits 0 but prints nothing: the grandchild that would print "ok" died with the namespace
    ("setsid grandchild", SETSID_GRANDCHILD, "ok", "ok", {}),
    ("fork bomb", FORK_BOMB, "timed out", "timed out", {"timeout_s": 2, "max_processes": 16}),
    ("write to an existing /tmp file", "open({TMPVICTIM!r}, 'r+').write('x')\nprint('ok')",
     "FileNotFoundError", "FileNotFoundError", {}),
    ("write to $HOME", "open({HOME!r} + '/.bashrc', 'a').write('x')\nprint('ok')",
     "FileNotFoundError", "FileNotFoundError", {}),
    ("write to a system dir", "open('/etc/rlctl-pwned', 'w').write('x')\nprint('ok')",
     "sandbox: writing outside", "Read-only file system", {}),
    ("read /etc/shadow", "print(len(open('/etc/shadow').read()) * 0 or 'ok')", "FileNotFoundError",
     "FileNotFoundError", {}),  # the snippet's /etc is a minimal one: no credentials files at all
    ("read the run directory", "print(open({RUN!r} + '/secret.txt').read() and 'ok')", "FileNotFoundError",
     "FileNotFoundError", {}),
    ("tcp connect to host loopback",
     "import socket\nsocket.create_connection(('127.0.0.1', {PORT}), timeout=1)\nprint('ok')",
     "sandbox: socket.connect is not allowed", "Network is unreachable", {}),
    ("AF_UNIX path socket",
     "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({UNIX!r})\nprint('ok')",
     "sandbox: socket.connect is not allowed", "FileNotFoundError", {}),
    ("AF_UNIX abstract socket",
     "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({ABSTRACT!r})\nprint('ok')",
     "sandbox: socket.connect is not allowed", "ConnectionRefusedError", {}),
    ("AF_NETLINK", NETLINK, "sandbox: socket family 16 is not allowed", "Operation not permitted", {}),
    ("ctypes", CTYPES, "sandbox: importing _ctypes is not allowed", "setuid(0) refused", {}),
    ("huge output", "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", "File too large",
     "File too large", {"max_file_mb": 1}),
    ("signal to the test process", "import os, signal\nos.kill({PID}, signal.SIGUSR1)\nprint('ok')",
     "ProcessLookupError", "ProcessLookupError", {}),
    ("signal to the parent", PARENT, "parent not visible", "parent not visible", {}),
    ("signal to every process", "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('ok')",
     "ProcessLookupError", "ProcessLookupError", {}),  # its namespace holds no one else to signal
    ("sleep past the limit", "import time\ntime.sleep(60)\nprint('ok')", "timed out", "timed out",
     {"timeout_s": 1}),
]  # fmt: skip


def _fill(snippet: str, host: dict) -> str:
    return snippet.format(**{k: v for k, v in host.items() if not k.startswith("_")})


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "os-only"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_snippet_is_contained(host, case, guard):
    name, snippet, guard_reason, os_reason, extra = case
    code = _fill(snippet, host)
    limits = SandboxLimits(guard=guard, **extra)
    if refused_here():  # this host lacks a layer: nothing runs, and the reason says which
        res = run_python(code, limits=limits)
        assert res.error is not None and res.error.startswith("sandbox refused: reward.sandbox = 'strict'")
        return
    res = run_python(code, limits=limits)
    want = guard_reason if guard else os_reason
    assert "ok" not in res.stdout.split(), (name, res)
    assert res.reason == want if want == "ok" else want in res.reason, (name, res.reason, res.stderr[-2000:])
    assert res.uid is not None and live_pids_of_uid(res.uid) == [], f"{name}: a process survived"
    assert not Path(host["TMPNEW"]).exists()


def test_hostile_snippets_score_zero(host):
    """The same attacks through code_score: every one scores 0 (no refusal raises)."""
    require_strict()
    for name, snippet, *_, extra in CASES[:3]:
        out = code_score("code", _fill(snippet, host), PRINTS_OK, limits=SandboxLimits(**extra))
        assert out["score"] == 0.0, name


def test_new_file_in_tmp_stays_in_the_private_scratch(host):
    """Writing /tmp/NEW is allowed (it is the scratch), and nothing appears in the host's /tmp."""
    require_strict()
    res = run_python(_fill("open({TMPNEW!r}, 'w').write('x')\nimport os\nprint(os.listdir('/tmp'))", host))
    assert res.ok and Path(host["TMPNEW"]).name in res.stdout
    assert not Path(host["TMPNEW"]).exists()


def test_concurrent_hostile_runs_do_not_leak(host):
    """Four setsid-grandchild runs at once (as the reward manager does): none leaves a process."""
    require_strict()
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(run_python(SETSID_GRANDCHILD))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.uid for r in results}) == 4  # a uid per run
    for r in results:
        assert r.stdout == "" and live_pids_of_uid(r.uid) == []
