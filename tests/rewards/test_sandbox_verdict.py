"""Round-three forgeries: wrong programs that scored 1.0 under test-code ground truth.

Each snippet here scored 1.0 before the verdict moved out of the snippet's process: it reached
the guard's nonce and witness fd through a hook that called its code (``__fspath__``, a ``str``
subclass's ``startswith``), read ``tests.py`` from its working directory, read the calling test
frame's constants or the tests' own variables, or rebound the builtins the tests' type guard uses.
"""

from __future__ import annotations

import pytest

from rlctl.rewards.code import code_score
from rlctl.rewards.sandbox import run_python
from tests.rewards.sandbox_host import require_strict

pytestmark = pytest.mark.timeout(120)
# the guard the README recommends against an always-equal object: the result's exact type
TESTS = "r = double(21)\nassert type(r) is int and r == 42\nr = double(-1)\nassert type(r) is int and r == -2\n"
TABLE_TESTS = "cases = [(21, 42), (-1, -2), (5, 10)]\nfor a, b in cases:\n    r = double(a)\n    assert type(r) is int and r == b\n"
RIGHT = "def double(x):\n    return 2 * x\n"

_STEAL = (
    "import os, sys\n"
    "def steal():\n"
    "    f = sys._getframe(1)\n"
    "    while f is not None:\n"
    "        loc = f.f_locals\n"
    "        if loc.get('nonce') and 'out_fd' in loc:\n"
    "            os.write(loc['out_fd'], loc['nonce'])\n"
    "            os._exit(0)\n"
    "        f = f.f_back\n"
)
FORGERIES = {
    "__fspath__ run by the hook reaches its nonce": _STEAL
    + "class P:\n    def __fspath__(self):\n        steal()\n        return 'x'\n"
    "import shutil\nshutil.copyfile(P(), 'y')\n",
    "str subclass startswith run by the hook": _STEAL
    + "class S(str):\n    def startswith(self, *a):\n        steal()\n        return str.startswith(self, *a)\n"
    "open(S('x'), 'w')\n",
    "exception traceback from the hook": "import os, sys\n"
    "try:\n    sys.audit('open', None, None, None, None)\nexcept Exception as e:\n    tb = e.__traceback__\n"
    "    while tb is not None:\n        loc = tb.tb_frame.f_locals\n"
    "        if loc.get('nonce') and 'out_fd' in loc:\n            os.write(loc['out_fd'], loc['nonce'])\n"
    "            os._exit(0)\n        tb = tb.tb_next\n",
    "reads tests.py and answers from a table": "import re\n"
    "SRC = open('tests.py').read()\n"
    "TABLE = {int(a): int(b) for a, b in re.findall(r'double\\((-?\\d+)\\)\\n.*?r == (-?\\d+)', SRC)}\n"
    "TABLE.update({int(a): int(b) for a, b in re.findall(r'\\((-?\\d+), (-?\\d+)\\)', SRC)})\n"
    "def double(x):\n    return TABLE.get(x, 0)\n",
    "reads the calling test frame's constants": "import sys\n"
    "def double(x):\n    consts = [c for c in sys._getframe(1).f_code.co_consts if type(c) is int]\n"
    "    return consts[consts.index(x) + 1] if x in consts else 0\n",
    "reads the tests' own variables": "def double(x):\n"
    "    return dict(globals().get('cases', [])).get(x, 0)\n",
    "defines the builtins the tests use": "def sorted(*a, **k):\n    return [0, 2, 4]\n"
    "def double(x):\n    return 0\ndef evens(n):\n    return []\n",
    "rebinds the builtins the type guard uses": "import builtins\n"
    "class Eq(int):\n    def __eq__(self, other):\n        return True\n"
    "real = type\nbuiltins.type = lambda o: int if real(o) is Eq else real(o)\n"
    "def double(x):\n    return Eq(0)\n",
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_forgeries_score_zero(name):
    require_strict()
    tests = TABLE_TESTS if "variables" in name else TESTS
    if "builtins the tests use" in name:
        tests = "assert sorted(evens(6)) == [0, 2, 4]\n"
    out = code_score("code", f"```python\n{FORGERIES[name]}```", tests)
    assert out["score"] == 0.0, name


def test_the_right_program_still_scores_one():
    require_strict()
    assert code_score("code", RIGHT, TESTS)["score"] == 1.0
    assert code_score("code", RIGHT, TABLE_TESTS)["score"] == 1.0


def test_the_hook_never_runs_the_snippets_code():
    """Path-like objects, str subclasses and odd audit arguments are refused without calling them."""
    require_strict()
    snippet = (
        "import shutil, sys, os\n"
        "calls = []\n"
        "class P:\n    def __fspath__(self):\n        calls.append('fspath')\n        return 'x'\n"
        "class S(str):\n    def startswith(self, *a):\n        calls.append('startswith')\n        return False\n"
        "    def __format__(self, spec):\n        calls.append('format')\n        return 'x'\n"
        "class H:\n    def __hash__(self):\n        calls.append('hash')\n        return 1\n"
        "    def __eq__(self, o):\n        calls.append('eq')\n        return True\n"
        "    @property\n    def __class__(self):\n        calls.append('class')\n        return int\n"
        "for attempt in (lambda: shutil.copyfile(P(), 'y'), lambda: open(S('x'), 'w'),\n"
        "                lambda: open(S('/proc/1/mem'), 'rb'), lambda: sys.audit('import', H()),\n"
        "                lambda: sys.audit('socket.__new__', None, H(), 1, 0),\n"
        "                lambda: sys.audit('open', H(), 'w', H()), lambda: sys.audit('os.remove', P(), -1)):\n"
        "    try:\n        attempt()\n        print('allowed')\n"
        "    except PermissionError:\n        print('denied')\n"
        "    except Exception as e:\n        print('error', type(e).__name__)\n"
        "print('calls', calls)\n"
    )
    res = run_python(snippet)
    assert res.ok, res.reason
    lines = res.stdout.splitlines()
    assert lines[-1] == "calls []", res.stdout
    assert lines[:-1] == ["denied"] * 7, res.stdout


def _score(program: str, tests: str) -> float:
    return code_score("code", f"```python\n{program}```", tests)["score"]


def test_an_always_equal_object_cannot_cross_to_the_tests():
    """Even tests without the type guard: the object stays in the solution, equal only to itself."""
    require_strict()
    eq = "class Eq:\n    def __eq__(self, o):\n        return True\n    __hash__ = object.__hash__\n"
    assert _score(eq + "def double(x):\n    return Eq()\n", "assert double(21) == 42\n") == 0.0
    subclass = "class Eq(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
    assert _score(subclass + "def double(x):\n    return Eq(0)\n", "assert double(21) == 42\n") == 0.0
    nested = eq + "def pair(x):\n    return [Eq(), Eq()]\n"
    assert _score(nested, "assert pair(1) == [1, 2]\n") == 0.0


def test_the_judge_is_closed_to_the_solution_process():
    """The judge's /proc entries (its fds, its memory) refuse a process of the same uid."""
    require_strict()
    probe = (
        "import os\njudge = os.getppid()\n"
        "for what in ('fd', 'environ', 'maps'):\n"
        "    try:\n        os.listdir(f'/proc/{judge}/fd') if what == 'fd' else open(f'/proc/{judge}/{what}').read()\n"
        "        print(what, 'readable')\n    except PermissionError:\n        print(what, 'closed')\n"
        "def f():\n    return 1\n"
    )
    res = run_python(probe, tests="assert f() == 1\n")
    assert res.ok and res.witnessed, res.reason
    assert res.stdout.split() == ["fd", "closed", "environ", "closed", "maps", "closed"], res.stdout


SOLUTION_SHAPES = """
class Solution:
    def __init__(self, k=1):
        self.k = k
    def scale(self, xs):
        return [self.k * x for x in xs]
def count(n):
    for i in range(n):
        yield i
def sort_in_place(xs):
    xs.sort()
def check(x):
    if x < 0:
        raise ValueError("negative")
    return x
def big():
    return 3 ** 200, -(2 ** 70), 1.5, b"\\x00\\xff", {(1, 2): {"a"}}, frozenset({None})
LIMIT = [1, 2, 3]
print("loaded")
"""
SHAPE_TESTS = """
assert Solution(3).scale([1, 2]) == [3, 6]
assert Solution(k=2).k == 2
assert list(count(3)) == [0, 1, 2]
xs = [3, 1, 2]
sort_in_place(xs)
assert xs == [1, 2, 3]
try:
    check(-1)
except ValueError as e:
    assert str(e) == "negative"
else:
    raise AssertionError("no error")
assert big() == (3 ** 200, -(2 ** 70), 1.5, b"\\x00\\xff", {(1, 2): {"a"}}, frozenset({None}))
assert LIMIT == [1, 2, 3] and type(LIMIT) is list
try:
    check(lambda: 0)
except TypeError:
    pass
else:
    raise AssertionError("a function crossed to the solution")
"""


def test_the_tests_call_the_solution_as_if_in_process():
    """Classes, generators, in-place changes, exceptions and big values behave as the tests expect."""
    require_strict()
    res = run_python(SOLUTION_SHAPES, tests=SHAPE_TESTS)
    assert res.ok and res.witnessed, res.reason + res.stderr
    assert res.stdout.strip() == "loaded"
    failing = run_python(SOLUTION_SHAPES, tests=SHAPE_TESTS + "assert count(2) is None\n")
    assert not failing.ok and not failing.witnessed
    assert "AssertionError" in failing.stderr


def test_a_correct_program_with_a_long_output_passes():
    """stdin/stdout cases read back only 64 KiB of stdout before: a longer right answer scored 0."""
    require_strict()
    want = "\n".join(str(i) for i in range(30_000))  # ~170 KB
    program = "n = int(input())\nprint('\\n'.join(str(i) for i in range(n)))\n"
    assert code_score("code", program, {"inputs": ["30000"], "outputs": [want]})["score"] == 1.0
    assert code_score("code", program, {"inputs": ["29999"], "outputs": [want]})["score"] == 0.0


def test_a_judge_that_cannot_set_itself_up_is_the_hosts_fault(tmp_path, monkeypatch):
    """Not a zero to train on: the code reward raises RunError naming why (like a missing layer)."""
    require_strict()
    from rlctl.errors import RunError
    from rlctl.rewards import sandbox

    broken = tmp_path / "sandbox_verdict.py"
    broken.write_text(
        "import os, sys\ndef run(*args):\n"
        "    print('sandbox: the judge cannot make itself non-dumpable: OSError: no prctl', file=sys.stderr)\n"
        "    os._exit(125)\n"
    )
    monkeypatch.setattr(sandbox, "VERDICT_SOURCE", broken)
    res = run_python(RIGHT, tests=TESTS)
    assert res.error is not None and "non-dumpable" in res.error
    with pytest.raises(RunError, match="non-dumpable"):
        code_score("code", RIGHT, TESTS)
    assert run_python("import os\nos._exit(125)\n").error is None  # a snippet's own exit 125 is its own
