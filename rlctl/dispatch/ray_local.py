"""A Ray cluster rlctl starts for itself: private, deaf to the driver's group signals, reaped.

- **Private**: its temp dir (sockets, session, logs) is inside a fresh ``mkdtemp`` (0700) instead
  of the shared ``/tmp/ray``, whose session directories Ray makes mode 777 (another local user could
  replace the raylet's and plasma's sockets there). Ray's token file is made 0600 in a 0700
  ``~/.ray`` (Ray writes it 0644).
- **Deaf to group signals**: Ray's processes start with SIGTERM, SIGINT, SIGUSR1 and SIGHUP
  blocked (a signal mask survives fork and exec; the driver's own mask is restored at once). A
  signal to the whole process group (SLURM's ``scancel``, ``timeout``, ``kill -- -PGID``) then
  reaches the driver only, which finishes its step, saves through the still-running workers and
  stops them; before, the GCS died with the same signal and the driver hung 60 s on it.
- **Reaped**: ``ray_reaper.py`` watches the driver and kills every process of the cluster when it
  dies, SIGKILL included (Ray's own fate sharing left its agents running).
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rlctl.errors import UserError

REAPER = Path(__file__).with_name("ray_reaper.py")
GROUP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP}
_reaper_pipes: list[int] = []  # write ends: held (never closed) for the driver's lifetime


def private_temp_dir() -> str:
    """Ray's temp dir inside a fresh 0700 directory (short: unix socket paths are limited).

    Ray makes its temp dir mode 777 whatever it was (``ray._private.utils.try_to_create_directory``,
    Ray 2.60), so the private one is its parent: no other user can reach anything below it.
    """
    parent = tempfile.mkdtemp(prefix="rlctl-ray-", dir="/tmp" if os.path.isdir("/tmp") else None)
    return os.path.join(parent, "r")


@contextlib.contextmanager
def group_signals_blocked() -> Iterator[None]:
    """Block the stop signals while Ray's processes are started (they inherit the mask)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, GROUP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def start_reaper(temp_dir: str) -> int:
    """Start the watchdog of this driver's cluster; its pid."""
    read_end, write_end = os.pipe()  # not inheritable: only this process holds the write end
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-B", str(REAPER), str(os.getpid()), temp_dir],
        stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
    )  # fmt: skip
    os.close(read_end)
    _reaper_pipes.append(write_end)
    return proc.pid


def private_token() -> None:
    """Ray's token file 0600 and its directory 0700 (Ray writes them 0644 and 0755)."""
    home = Path(os.path.expanduser("~/.ray"))
    token = home / "auth_token"
    with contextlib.suppress(OSError):
        if home.is_dir() and not home.is_symlink() and home.stat().st_uid == os.geteuid():
            home.chmod(0o700)
        if token.is_file() and not token.is_symlink() and token.stat().st_uid == os.geteuid():
            token.chmod(0o600)


def auto_address(address_file: str | None = None) -> str:
    """The address ``cluster.address = "auto"`` means, read only from a file no other user could write.

    Ray's own ``auto`` reads ``ray_current_cluster`` in its shared temp dir and, without one,
    joins any GCS it finds running on the host, whoever started it; rlctl passes the address
    explicitly instead. UserError (one line) for a file or directory another user owns or can
    write, or no file at all.
    """
    if address_file is None:
        from ray._common.utils import get_ray_address_file  # Ray 2.60: ray/_common/utils.py

        address_file = get_ray_address_file(None)
    path = Path(address_file)
    me = os.geteuid()
    fix = "give the head's address instead (cluster.address = 'IP:PORT')"
    for entry in (path.parent, path):
        try:
            st = os.lstat(entry)
        except FileNotFoundError:
            raise UserError(f"cluster.address = 'auto': no {path} (no Ray cluster of yours here); {fix}") from None
        if stat.S_ISLNK(st.st_mode) or st.st_uid not in (me, 0):
            raise UserError(
                f"cluster.address = 'auto': {entry} belongs to uid {st.st_uid} or is a symlink: another user "
                f"could point rlctl at their cluster; {fix}"
            )
        sticky_dir = entry == path.parent and st.st_mode & stat.S_ISVTX
        if st.st_mode & 0o022 and not sticky_dir:
            raise UserError(
                f"cluster.address = 'auto': {entry} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): "
                f"another user could replace the address in it; {fix}"
            )
    address = path.read_text().strip()
    if not address:
        raise UserError(f"cluster.address = 'auto': {path} is empty; {fix}")
    return address
