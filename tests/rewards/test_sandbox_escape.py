"""Round-two escapes: exit tricks that faked a pass, raw syscalls past the guard, memory across processes.

Each case here passed (scored 1.0, reached the kernel, or held the memory) before the witness,
the seccomp filter and the memory cgroup; the filter's decisions are also checked without a
kernel by evaluating its BPF program for every syscall.
"""

from __future__ import annotations

import errno
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.rewards.code import code_score
from rlctl.rewards.manager import build_reward_manager
from rlctl.rewards.sandbox import SandboxLimits, run_python
from rlctl.rewards.sandbox_seccomp import (
    AUDIT_ARCH,
    CLONE_NEW_FLAGS,
    DENIED,
    RET_ALLOW,
    RET_KILL_PROCESS,
    filter_program,
    syscall_numbers,
)
from tests.rewards.sandbox_host import require_strict

pytestmark = pytest.mark.timeout(90)
TESTS = "assert double(21) == 42\nassert double(-1) == -2\n"
WRONG = "def double(x):\n    return 0\n"
RIGHT = "def double(x):\n    return 2 * x\n"

EXIT_TRICKS = {
    "os._exit(0)": WRONG + "import os\nos._exit(0)\n",
    "raise SystemExit": WRONG + "raise SystemExit\n",
    "sys.exit(0)": WRONG + "import sys\nsys.exit(0)\n",
    "atexit os._exit": WRONG + "import atexit, os\natexit.register(os._exit, 0)\n",
    "fake printed marker": WRONG + "print('All tests passed')\nprint('OK')\nimport os\nos._exit(0)\n",
    "closed stdout and stderr": WRONG + "import os\nos.close(1)\nos.close(2)\n",
    "fork, parent exits 0": WRONG + "import os\nif os.fork():\n    os._exit(0)\n",
    "audit event from the snippet": WRONG + "import sys, os\nsys.audit('rlctl.witness')\nos._exit(0)\n",
    "witness fd guessed": WRONG + "import os\nfor fd in range(3, 128):\n    try:\n"
    "        os.write(fd, os.urandom(64).hex().encode())\n    except OSError:\n        pass\nos._exit(0)\n",
    "nonce fd read": WRONG + "import os\nfor fd in range(3, 128):\n    try:\n        n = os.read(fd, 256)\n"
    "    except OSError:\n        continue\n    for w in range(3, 128):\n        try:\n"
    "            os.write(w, n)\n        except OSError:\n            pass\nos._exit(0)\n",
    "trace function jumps past the asserts": WRONG + "import sys\n"
    "def tracer(frame, event, arg):\n    if event == 'line' and frame.f_code.co_filename == 'tests.py':\n"
    "        frame.f_lineno = 3\n    return tracer\nsys.settrace(tracer)\n",
    "frame walk to the tests' code": WRONG + "import sys, os\nf = sys._getframe()\nwhile f is not None:\n"
    "    code = f.f_locals.get('tests_code')\n    if code is not None:\n"
    "        fake = compile(\"__import__('sys').audit('rlctl.witness')\", code.co_filename, 'exec')\n"
    "        exec(fake, sys._getframe(0).f_globals)\n        exec(code.replace(co_consts=code.co_consts), globals())\n"
    "    f = f.f_back\nos._exit(0)\n",
}


@pytest.mark.parametrize("name", list(EXIT_TRICKS))
def test_exit_tricks_score_zero(name):
    require_strict()
    out = code_score("code", f"```python\n{EXIT_TRICKS[name]}```", TESTS)
    assert out["score"] == 0.0 and out["passed"] == 0, name


def test_a_right_program_still_scores_one_and_the_witness_is_what_decides():
    require_strict()
    assert code_score("code", RIGHT, TESTS)["score"] == 1.0
    res = run_python(WRONG + "import os\nos._exit(0)\n", tests=TESTS)
    assert not res.witnessed and not res.ok  # exit 0 passed the first rule; now the judge fails the run
    res = run_python(RIGHT, tests=TESTS)
    assert res.ok and res.witnessed


def test_exit_tricks_score_zero_through_the_reward_manager():
    require_strict()
    manager = build_reward_manager("code")
    programs = [*EXIT_TRICKS.values(), RIGHT]
    out = manager.score(["code"] * len(programs), programs, [TESTS] * len(programs))
    assert out.scores == [0.0] * len(EXIT_TRICKS) + [1.0]
    assert out.metrics["reward/errors"] == 0.0


RAW_SYSCALLS = r"""
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
NR = {nr!r}
def call(name, *args):
    r = libc.syscall(NR[name], *args)
    return "ok" if r >= 0 else errno_name(ctypes.get_errno())
def errno_name(e):
    import errno
    return errno.errorcode.get(e, str(e))
print("unshare", call("unshare", 0x10000000))
print("add_key", call("add_key", b"user", b"rlctl", b"v", 1, -3))
print("keyctl", call("keyctl", 0, -3, 0))
print("ptrace", call("ptrace", 0, 0, 0, 0))
print("clone", call("clone", 0x10000000 | 17, 0, 0, 0, 0))
print("bpf", call("bpf", 0, 0, 0))
print("io_uring_setup", call("io_uring_setup", 4, 0))
print("packet", call("socket", 17, 3, 0))
print("seccomp", open("/proc/self/status").read().split("Seccomp:")[1].split()[0])
print("keys", len(open("/proc/keys").read().splitlines()))
pid = os.fork()
if pid == 0:
    os._exit(7)
print("fork", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_raw_syscalls_past_the_guard_are_denied_by_seccomp():
    """What the issue's dir_fd snippet reached with raw syscalls now fails in the kernel."""
    import platform

    require_strict()
    res = run_python(
        RAW_SYSCALLS.format(nr=syscall_numbers(platform.machine())), limits=SandboxLimits(guard=False)
    )
    assert res.ok, res.stderr
    got = dict(line.split(" ", 1) for line in res.stdout.splitlines())
    for name in ("unshare", "add_key", "keyctl", "ptrace", "clone", "bpf", "io_uring_setup", "packet"):
        assert got[name] == "EPERM", (name, got)
    assert got["seccomp"] == "2" and got["keys"] == "1"  # filter mode; only the fresh session keyring
    assert got["fork"] == "7"  # plain fork (clone without CLONE_NEW*) still works


def test_dir_fd_to_proc_self_mem_is_refused_by_the_guard():
    require_strict()
    snippet = "import os\nfd = os.open('/proc/self', os.O_RDONLY)\nos.open('mem', os.O_RDWR, dir_fd=fd)\nprint('ok')"
    res = run_python(snippet)
    assert "ok" not in res.stdout and "opening a process's memory is not allowed" in res.reason
    res = run_python("import os\nos.open('/usr', os.O_RDONLY)\nopen('out.txt', 'w').write('x')\nprint('ok')")
    assert "writing outside the scratch directory" in res.reason  # relative to the /usr dir fd too
    assert run_python("open('out.txt', 'w').write('x')\nprint(open('out.txt').read())").stdout == "x\n"


HOLD = """
import mmap, os, time
kids = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        m = mmap.mmap(-1, 200 << 20)  # shared anonymous memory: RLIMIT_AS sees 200 MB per process
        for off in range(0, 200 << 20, 4096):
            m[off] = 1
        time.sleep(30)
        os._exit(0)
    kids.append(pid)
time.sleep(4)
alive = sum(os.waitpid(pid, os.WNOHANG)[0] == 0 for pid in kids)
print("alive", alive, flush=True)
"""


def test_four_processes_cannot_hold_more_than_the_run_memory_limit():
    require_strict()
    res = run_python(HOLD, limits=SandboxLimits(memory_mb=512, timeout_s=20))
    alive = [int(line.split()[1]) for line in res.stdout.splitlines() if line.startswith("alive")]
    assert alive == [] or alive[0] * 200 <= 512, (res.stdout, res.reason)  # before: alive 4 (800 MB)
    assert res.out_of_memory


def test_minimal_etc_and_no_host_credentials():
    require_strict()
    res = run_python("import os\nprint(sorted(os.listdir('/etc')))\nprint(open('/etc/passwd').read())")
    assert res.ok, res.stderr
    names = eval(res.stdout.splitlines()[0])
    assert "shadow" not in names and "passwd" in names and len(names) < 12
    assert res.stdout.count(":x:") == 3  # root, the run's user, nobody


# --- the filter itself, evaluated without a kernel ------------------------------------------


def _evaluate(prog, nr: int, arch: int, args: tuple[int, ...]) -> int:
    """Run a classic-BPF seccomp program on one ``struct seccomp_data``; the action it returns."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, *args)
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == 0x20:
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x54:
            acc &= k
        elif code == 0x06:
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        pc += 1


@settings(max_examples=300, deadline=None)
@given(
    machine=st.sampled_from(sorted(AUDIT_ARCH)),
    nr=st.integers(0, 460),
    args=st.tuples(*[st.integers(0, 2**32 - 1)] * 6),
)
def test_filter_denies_exactly_the_listed_calls(machine, nr, args):
    by_nr = {nr: name for name, nr in syscall_numbers(machine).items()}
    action = _evaluate(filter_program(machine), nr, AUDIT_ARCH[machine], args)
    name = by_nr.get(nr)
    eperm = 0x00050000 | errno.EPERM
    if name in DENIED:
        assert action == eperm
    elif name == "clone3":
        assert action == 0x00050000 | errno.ENOSYS
    elif name == "clone":
        assert action == (eperm if args[0] & CLONE_NEW_FLAGS else RET_ALLOW)
    elif name == "socket":
        assert action == (eperm if args[0] == 17 or args[1] & 0xF == 3 else RET_ALLOW)
    else:
        assert action == RET_ALLOW


def test_filter_kills_other_abis():
    prog = filter_program("x86_64")
    assert _evaluate(prog, 272, 0x40000003, (0,) * 6) == RET_KILL_PROCESS  # i386
    assert _evaluate(prog, 0x40000000 | 39, AUDIT_ARCH["x86_64"], (0,) * 6) == RET_KILL_PROCESS  # x32
