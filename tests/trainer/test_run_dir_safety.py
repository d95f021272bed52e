"""Run directories: another user's planted symlinks, two runs on one directory, a torn export.

Each CLI case here ran before: ``rlctl train`` as root wrote the profile through a symlink another
user planted (overwriting a root-owned 0600 file), ran in a world-writable run directory, and a
second run on a live run's directory resumed, truncated and deleted its files.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rlctl.errors import UserError
from rlctl.tracking.run_files import RunLock, atomic_dir, open_nofollow, prepare_run_dir
from tests.cli_runner import run_cli

OTHER_UID = 65534  # nobody
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory another user owns")


def _one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert "Traceback" not in err and lines, err
    return lines[-1]


@as_root
def test_a_run_directory_of_another_user_is_refused_and_its_symlinks_never_followed(write_profile, tmp_path):
    secret = tmp_path / "root-only"
    secret.write_text("root's own\n")
    secret.chmod(0o600)
    run_dir = tmp_path / "runs" / "t"
    run_dir.mkdir(parents=True)
    (run_dir / "profile.toml").symlink_to(secret)
    (run_dir / "metrics.jsonl").symlink_to(tmp_path / "chosen-by-them")
    os.lchown(run_dir / "profile.toml", OTHER_UID, OTHER_UID)
    os.chown(run_dir, OTHER_UID, OTHER_UID)
    code, _, err = run_cli("train", str(write_profile("t")))
    assert code == 2
    assert f"owned by uid {OTHER_UID}" in _one_line(err)
    assert secret.read_text() == "root's own\n" and not (tmp_path / "chosen-by-them").exists()


def test_a_world_writable_run_directory_is_refused(write_profile, tmp_path):
    run_dir = tmp_path / "runs" / "t"
    run_dir.mkdir(parents=True)
    run_dir.chmod(0o777)
    code, _, err = run_cli("train", str(write_profile("t")))
    assert code == 2 and "writable by group or others (mode 777)" in _one_line(err)
    assert list(run_dir.iterdir()) == []


def test_a_symlink_where_rlctl_writes_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UserError, match="metrics.jsonl: a symlink in the run directory"):
        prepare_run_dir(run_dir)
    with pytest.raises(OSError) as info:  # and the writers themselves never follow one
        open_nofollow(run_dir / "metrics.jsonl", "a")
    assert info.value.errno == errno.ELOOP and not (tmp_path / "elsewhere").exists()


def test_a_parent_others_can_write_without_the_sticky_bit_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the parent another owner")
    parent = tmp_path / "shared"
    parent.mkdir()
    os.chown(parent, OTHER_UID, OTHER_UID)
    parent.chmod(0o777)
    with pytest.raises(UserError, match="no sticky bit"):
        prepare_run_dir(parent / "run")
    parent.chmod(0o1777)  # sticky, like /tmp: no one can swap another's entry
    assert prepare_run_dir(parent / "run") == parent / "run"


def test_a_second_run_on_a_live_run_directory_exits_2_naming_the_holder(write_profile, tmp_path):
    run_dir = tmp_path / "runs" / "t"
    run_dir.mkdir(parents=True)
    with RunLock(run_dir):
        code, _, err = run_cli("train", str(write_profile("t")))
    assert code == 2
    line = _one_line(err)
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in line and "in use" in line
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # nothing of the live run touched


def test_the_lock_goes_with_its_process_even_on_sigkill(tmp_path):
    hold = (
        "import sys, time\nfrom rlctl.tracking.run_files import RunLock\n"
        f"lock = RunLock({str(tmp_path)!r})\nprint('held', flush=True)\ntime.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=f"pid {proc.pid} on host"):
            RunLock(tmp_path)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    RunLock(tmp_path).release()


def test_a_full_disk_during_an_export_leaves_the_previous_export_or_none(tmp_path):
    final = tmp_path / "hf"

    def torn_export(directory: Path) -> None:
        (directory / "config.json").write_text("{}")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory / "model.safetensors"))

    with pytest.raises(OSError), atomic_dir(final) as tmp:
        torn_export(tmp)
    assert not final.exists() and sorted(p.name for p in tmp_path.iterdir()) == []
    with atomic_dir(final) as tmp:
        (tmp / "config.json").write_text("{}")
        (tmp / "model.safetensors").write_bytes(b"w")
    with pytest.raises(OSError), atomic_dir(final) as tmp:
        torn_export(tmp)
    assert sorted(p.name for p in final.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_group_write_is_allowed_only_for_the_users_own_group(tmp_path):
    import grp
    import pwd

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_dir.chmod(0o775)
    me = pwd.getpwuid(os.geteuid()).pw_name
    own = not (set(grp.getgrgid(os.getegid()).gr_mem) - {me}) and not [
        p for p in pwd.getpwall() if p.pw_gid == os.getegid() and p.pw_name != me
    ]
    if own:
        assert prepare_run_dir(run_dir) == run_dir  # a umask-002 system's run directory still runs
    if os.geteuid() == 0:
        os.chown(run_dir, 0, OTHER_UID)  # a group others are in
        with pytest.raises(UserError, match="writable by group or others"):
            prepare_run_dir(run_dir)


@as_root
def test_an_entry_another_user_owns_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    os.chown(run_dir / "checkpoints", OTHER_UID, OTHER_UID)  # they could plant step_* symlinks in it
    with pytest.raises(UserError, match=f"checkpoints: owned by uid {OTHER_UID}"):
        prepare_run_dir(run_dir)
