"""Test code decided outside the snippet's process: the tests call the solution over a pipe.

Loaded by ``sandbox_guard.py`` inside the sandbox (stdlib only, run by ``exec``). The guard's
process (the *judge*) makes itself non-dumpable (its ``/proc`` files and memory are closed to a
process of the same uid), then forks the *solution* process before it reads anything secret:
the solution closes the nonce, witness and tests fds, installs the audit hook, runs the snippet
and then only answers requests. The judge then reads the nonce and the tests, and runs the tests
in its own interpreter, where every top-level name of the snippet is a value or a ``Remote``:
calling it, reading an attribute, indexing, iterating or taking its length is a request to the
solution, whose answers come back as plain data (None, bool, int, float, str, bytes, list, tuple,
dict, set, frozenset; anything else stays in the solution as a handle). A top-level name of the
snippet that is also a builtin's (``sorted``, ``isinstance``) is not passed: the tests keep the
builtin.

So no code of the snippet ever runs in the judge: the tests, their constants and variables, the
builtins they use and the nonce live where the snippet cannot reach them, and what the tests
compare is real data (an object equal to everything cannot cross the pipe; it arrives as a
``Remote``, equal only to itself). The judge writes the nonce to the witness fd only when the
tests ran to their end. Arguments go to the solution as copies; a list, dict or set argument the
solution changed is updated in place in the tests afterwards. Tests cannot pass their own
functions or objects to the solution (a TypeError in the tests).
"""

import builtins
import contextlib
import json
import os
import sys
import time
import traceback

MAX_FRAME = 32 << 20  # bytes of one request or reply
SETUP_FAILED = 125  # the judge's exit when it cannot set itself up (sandbox.JUDGE_SETUP_FAILED)
_TAGS = {"l": list, "t": tuple, "s": set, "f": frozenset}
_WIDE = 1 << 53  # ints beyond this travel as hex (no decimal digit limit, exact)


class SolutionGone(BaseException):  # noqa: N818 - not an Exception: tests' ``except Exception`` cannot hide it
    """The solution process exited, or sent something that is not a reply."""


class SolutionError(Exception):
    """An exception the solution raised whose type is not a builtin exception."""


def _encode(x, handle):
    """Plain data as tagged JSON; ``handle(x)`` names anything else (the solution's side)."""
    t = type(x)
    if x is None or t is bool or t is str or t is float:
        return x
    if t is int:
        return x if -_WIDE < x < _WIDE else {"i": format(x, "x")}
    if t is bytes or t is bytearray:
        return {"b": bytes(x).hex()}
    for tag, kind in _TAGS.items():
        if t is kind:
            return {tag: [_encode(v, handle) for v in x]}
    if t is dict:
        return {"d": [[_encode(k, handle), _encode(v, handle)] for k, v in x.items()]}
    return handle(x)


def _decode(v, remote):
    """Tagged JSON back to plain data; ``remote(n)`` for a handle. Anything malformed: ValueError."""
    t = type(v)
    if v is None or t is bool or t is int or t is float or t is str:
        return v
    if t is not dict or len(v) != 1:
        raise ValueError("malformed value")
    ((tag, body),) = v.items()
    if tag == "i" and type(body) is str:
        return int(body, 16)
    if tag == "b" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "h" and type(body) is int:
        return remote(body)
    if type(body) is not list:
        raise ValueError("malformed value")
    if tag in _TAGS:
        return _TAGS[tag](_decode(item, remote) for item in body)
    if tag == "d":
        return {_decode(k, remote): _decode(w, remote) for k, w in (_pair(p) for p in body)}
    raise ValueError("malformed value")


def _pair(p):
    if type(p) is not list or len(p) != 2:
        raise ValueError("malformed value")
    return p


class _Pipe:
    """Length-prefixed JSON frames over a pair of pipe fds."""

    def __init__(self, read_fd, write_fd):
        self.rfile = os.fdopen(read_fd, "rb")
        self.wfile = os.fdopen(write_fd, "wb")

    def send(self, obj):
        data = json.dumps(obj, separators=(",", ":")).encode()
        self.wfile.write(len(data).to_bytes(8, "big") + data)
        self.wfile.flush()

    def recv(self):
        head = self.rfile.read(8)
        if len(head) != 8:
            return None
        size = int.from_bytes(head, "big")
        if size > MAX_FRAME:
            raise ValueError(f"a frame of {size} bytes")
        data = self.rfile.read(size)
        if len(data) != size:
            return None
        return json.loads(data)


# --- the solution's side -------------------------------------------------------------------------


def _serve(pipe, namespace):
    """Answer the judge's requests until it says exit (or goes away). Never returns."""
    handles = {}

    def handle(x):
        if type(x).__module__ == "numpy" and hasattr(x, "tolist"):
            return _encode(x.tolist(), handle)  # numpy values travel as plain data
        handles[len(handles) + 1] = x
        return {"h": len(handles)}

    def arg(v):
        return _decode(v, handles.__getitem__)

    names = {k: v for k, v in namespace.items() if not k.startswith("__")}
    pipe.send({"names": {k: _encode(v, handle) for k, v in names.items()}})
    while (msg := pipe.recv()) is not None and msg.get("op") != "exit":
        op, target = msg.get("op"), handles.get(msg.get("h"))
        try:
            args = [arg(a) for a in msg.get("a", [])]
            kwargs = {k: arg(v) for k, v in msg.get("k", {}).items()}
            if op == "call":
                result = target(*args, **kwargs)
            elif op == "getattr":
                result = getattr(target, args[0])
            elif op == "getitem":
                result = target[args[0]]
            else:
                result = {"len": len, "iter": iter, "next": next, "bool": bool}[op](target)
            mutated = [[i, _encode(a, handle)] for i, a in enumerate(args) if type(a) in (list, dict, set)]
            reply = {"ok": _encode(result, handle), "m": mutated}
        except Exception as exc:  # noqa: BLE001 - the solution's error goes back to the tests
            try:
                text = str(exc)[:2000]
            except Exception:  # noqa: BLE001
                text = ""
            reply = {"err": [type(exc).__name__, text]}
        sys.stdout.flush()
        pipe.send(reply)
    sys.stdout.flush()
    os._exit(0)


# --- the judge's side ----------------------------------------------------------------------------


class Remote:
    """An object that stays in the solution process; every use is a request to it."""

    __slots__ = ("_h", "_link")

    def __init__(self, h, link):
        object.__setattr__(self, "_h", h)
        object.__setattr__(self, "_link", link)

    def __call__(self, *args, **kwargs):
        return self._link.request("call", self._h, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._link.request("getattr", self._h, (name,))

    def __getitem__(self, key):
        return self._link.request("getitem", self._h, (key,))

    def __len__(self):
        return self._link.request("len", self._h)

    def __iter__(self):
        return self._link.request("iter", self._h)

    def __next__(self):
        return self._link.request("next", self._h)

    def __bool__(self):
        return self._link.request("bool", self._h) is True

    def __repr__(self):
        return f"<solution object {self._h}>"


class _Link:
    """The judge's end: requests out, replies decoded strictly."""

    def __init__(self, pipe):
        self.pipe = pipe

    def _remote(self, h):
        return Remote(h, self)

    def _arg(self, x):
        if type(x) is Remote:
            return {"h": x._h}
        if x is None or isinstance(x, (bool, str, float)):
            return x
        if isinstance(x, int):
            return x if -_WIDE < x < _WIDE else {"i": format(x, "x")}
        if isinstance(x, (bytes, bytearray)):
            return {"b": bytes(x).hex()}
        if isinstance(x, dict):
            return {"d": [[self._arg(k), self._arg(v)] for k, v in x.items()]}
        for tag, kind in (("t", tuple), ("l", list), ("f", frozenset), ("s", set)):
            if isinstance(x, kind):
                return {tag: [self._arg(v) for v in x]}
        raise TypeError(f"the tests can pass the solution plain data only, not {type(x).__name__}")

    def _recv(self):
        try:
            reply = self.pipe.recv()
        except ValueError as exc:
            raise SolutionGone(f"the solution sent a malformed reply: {exc}") from None
        if reply is None:
            raise SolutionGone("the solution process exited before answering")
        return reply

    def names(self):
        reply = self._recv()
        if type(reply) is not dict or type(reply.get("names")) is not dict:
            raise SolutionGone("the solution sent a malformed reply")
        names = reply["names"].items()
        # a name of a builtin stays the builtin: a snippet defining ``sorted`` or ``isinstance``
        # must not decide what the tests compute with them
        return {k: self._value(v) for k, v in names if type(k) is str and not hasattr(builtins, k)}

    def _value(self, v):
        try:
            return _decode(v, self._remote)
        except (ValueError, TypeError, RecursionError) as exc:
            raise SolutionGone(f"the solution sent a malformed value: {exc}") from None

    def request(self, op, h, args=(), kwargs=None):
        sent = [self._arg(a) for a in args]
        self.pipe.send({"op": op, "h": h, "a": sent, "k": {k: self._arg(v) for k, v in (kwargs or {}).items()}})
        reply = self._recv()
        if type(reply) is not dict:
            raise SolutionGone("the solution sent a malformed reply")
        if "err" in reply:
            raise _rebuilt(reply["err"])
        for i, value in reply.get("m", []) if type(reply.get("m")) is list else []:
            if type(i) is int and 0 <= i < len(args):
                _update(args[i], self._value(value))
        return self._value(reply.get("ok"))


def _update(orig, new):
    """Apply the solution's change of a list, dict or set argument to the tests' own object."""
    if isinstance(orig, list) and type(new) is list:
        orig[:] = new
    elif isinstance(orig, (dict, set)) and type(new) is type(orig):
        orig.clear()
        orig.update(new)


def _rebuilt(err):
    """The solution's exception as the builtin of that name, or SolutionError."""
    name, text = (err + ["", ""])[:2] if type(err) is list else ("", "")
    cls = getattr(builtins, name, None) if type(name) is str else None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(text)
        except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError wants five arguments
            pass
    return SolutionError(f"{name}: {text}")


def _undumpable():
    """PR_SET_DUMPABLE 0: a process of the same uid cannot open this one's /proc files or memory."""
    import ctypes

    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    for name in [m for m in sys.modules if m == "_ctypes" or m == "ctypes" or m.startswith("ctypes.")]:
        del sys.modules[name]


def run(fds, snippet_code, snippet_path, install_hook, run_snippet):
    """Fork the solution, run the tests here; write the nonce to the witness fd iff they end. Exits."""
    nonce_fd, out_fd, tests_fd = fds
    try:
        _undumpable()
    except Exception as exc:  # noqa: BLE001 - the host's fault: the sandbox reports it, no score
        print(f"sandbox: the judge cannot make itself non-dumpable: {type(exc).__name__}: {exc}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        for fd in (nonce_fd, out_fd, tests_fd, req_w, rep_r):
            os.close(fd)
        install_hook()
        try:
            namespace = run_snippet(snippet_code, snippet_path)
        except SystemExit as exc:
            sys.stdout.flush()
            os._exit(exc.code if type(exc.code) is int else 1)
        except BaseException:  # noqa: BLE001 - the snippet's own failure: its traceback, exit 1
            traceback.print_exc()
            sys.stdout.flush()
            os._exit(1)
        _serve(_Pipe(req_r, rep_w), namespace)
    os.close(req_r)
    os.close(rep_w)
    nonce = os.read(nonce_fd, 256)
    os.close(nonce_fd)
    with os.fdopen(tests_fd, "rb") as f:
        tests = f.read()
    install_hook()
    pipe = _Pipe(rep_r, req_w)
    link = _Link(pipe)
    code = 1
    try:
        namespace = {"__name__": "__main__", "__builtins__": builtins}
        namespace.update(link.names())
        exec(compile(tests, "tests.py", "exec"), namespace)
        code = 0
    except SolutionGone as exc:
        print(f"sandbox: {exc}", file=sys.stderr)
    except BaseException:  # noqa: BLE001 - a failing test: its traceback, no witness
        traceback.print_exc()
    if code == 0 and nonce:
        os.write(out_fd, nonce)
    _stop(pipe, pid)
    sys.stdout.flush()
    os._exit(code)


def _stop(pipe, pid):
    """Ask the solution to exit (it flushes its output), then kill it if it has not within 1 s."""
    with contextlib.suppress(OSError):
        pipe.send({"op": "exit"})
    for _ in range(100):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
