"""Watchdog of a Ray cluster rlctl started: when the driver dies, by any signal, nothing of it stays.

Run by the driver as ``python -I -S -B ray_reaper.py DRIVER_PID RAY_TEMP_DIR`` (stdlib only) with
the read end of a pipe on stdin whose write end only the driver holds: EOF means the driver is
gone (a normal exit, a crash, SIGKILL). It runs in a session of its own and ignores the stop
signals, so a signal to the driver's process group does not end it before the driver.

While the driver lives it records, every second, the driver's descendants (Ray's GCS,
raylet, agents and workers; workers retitle themselves ``ray::...``, so their command lines do not
say whose they are) with their start times. On EOF it SIGKILLs every recorded process still alive
with the same start time, and every process whose command line names RAY_TEMP_DIR (a daemon
started after the last record), until none is left (up to 10 s).
"""

import contextlib
import os
import select
import signal
import sys
import time


def _stat(pid):
    """(ppid, start time) of ``pid``, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _all():
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                out[int(entry)] = st
    return out


def _descendants(root, procs):
    children = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out[pid] = procs[pid][1]
        todo.extend(children.get(pid, []))
    return out


def _named(temp_dir, me):
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if temp_dir.encode() in f.read():
                    out.append(int(entry))
        except OSError:
            continue
    return out


def main():
    driver, temp_dir = int(sys.argv[1]), sys.argv[2]
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(signum, signal.SIG_IGN)
    known = {}
    while not select.select([0], [], [], 1.0)[0]:
        known.update(_descendants(driver, _all()))
    while os.read(0, 4096):  # only EOF ends the watch
        pass
    me = os.getpid()
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        procs = _all()
        doomed = [p for p, start in known.items() if p in procs and procs[p][1] == start and p != me]
        doomed += _named(temp_dir, me)
        if not doomed:
            return
        for pid in doomed:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


if __name__ == "__main__":
    main()
