"""Where rlctl's local Ray cluster listens: on loopback only, behind Ray's token auth.

Ray's own servers (GCS, raylet, object manager, core workers) bind their node IP, and on Linux
Ray refuses a loopback node IP (``ray._private.services.resolve_ip_for_localhost``): a plain
``ray.init()`` listens on every interface. The single-machine mode Ray uses on macOS and Windows
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` false; ``ray/_private/ray_constants.py`` and
``services.get_node_ip_address`` in Ray 2.60) makes the node IP 127.0.0.1, so every one of them
binds loopback (checked with ``ss -ltn`` on Ray 2.60; tests/dispatch/test_ray_network.py). rlctl turns it on for clusters it starts itself, never when it joins one.

Loopback is reachable by every local user, so the cluster also needs token auth, Ray's default
from 2.59 (``RAY_AUTH_MODE``, ``ray/_private/authentication/authentication_token_setup.py``):
rlctl requires Ray >= 2.59.
"""

from __future__ import annotations

import ipaddress
import os

SINGLE_HOST_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
AUTH_ENV = "RAY_AUTH_MODE"
TOKEN_AUTH_SINCE = (2, 59)


def bind_loopback() -> None:
    """Make the Ray cluster this process starts next listen on 127.0.0.1 only (and its workers)."""
    os.environ[SINGLE_HOST_ENV] = "0"  # read at ``import ray`` here and in every process Ray starts
    try:
        from ray._private import ray_constants
    except ImportError:  # pragma: no cover - no Ray: nothing to bind
        return
    ray_constants.ENABLE_RAY_CLUSTER = False  # ray was already imported: services reads this attribute


def token_auth(version: str | None = None, env: dict[str, str] | None = None) -> tuple[bool, str]:
    """Whether clusters started here require Ray's token; with why (one line)."""
    env = os.environ if env is None else env
    if version is None:
        import ray

        version = ray.__version__
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if parts < TOKEN_AUTH_SINCE:
        return False, f"Ray {version} has no token auth by default (needs >= 2.59)"
    if env.get(AUTH_ENV, "").lower() == "disabled":
        return False, f"{AUTH_ENV}=disabled turns Ray's token auth off"
    return True, f"token auth on (Ray {version})"


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def process_tree(root: int) -> list[int]:
    """``root`` and every live process descended from it (Ray's daemons and workers of a driver)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _decode(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))  # /proc/net/tcp6: host-order words
    addr = ipaddress.IPv6Address(words)
    return str(addr.ipv4_mapped or addr)


def listening_addresses(root: int | None = None) -> list[str]:
    """``ip:port`` of every TCP socket listening in ``root``'s process tree (default: this one)."""
    inodes: set[str] = set()
    for pid in process_tree(os.getpid() if root is None else root):
        inodes |= _socket_inodes(pid)
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ip, port = fields[1].split(":")
                found.add(f"{_decode(ip)}:{int(port, 16)}")
    return sorted(found)


def off_loopback(addresses: list[str]) -> list[str]:
    """The addresses not in 127.0.0.0/8 or ::1."""
    return [a for a in addresses if not ipaddress.ip_address(a.rsplit(":", 1)[0]).is_loopback]
