"""A full disk during a checkpoint save: one line naming the checkpoint, the cause (no space left
on device), the space needed and the space free; the partial save removed, earlier ones kept.

Simulated (an ENOSPC raised where DCP writes, or by a worker) and real (a tmpfs of a few MB,
mounted when this process may; skipped otherwise)."""

from __future__ import annotations

import errno
import os
import subprocess
import traceback
import uuid
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

from rlctl.dispatch.errors import WorkerError
from rlctl.engines import disk_space, fsdp_io
from rlctl.errors import DiskFullError
from rlctl.trainer.state import checkpoint as ck
from tests.cli_runner import run_cli


def _enospc(name: str = "x.distcp") -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)


def _dcp_failure() -> CheckpointException:
    """What DCP raises on a full disk: torch's zip writer error, the ENOSPC only its context."""
    try:
        try:
            raise _enospc()
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")  # noqa: B904
    except RuntimeError as exc:
        return CheckpointException("write", {0: _wrap_exception(exc)})


def _one_line(text: str) -> None:
    assert "\n" not in text.strip() and "Traceback" not in text, text


def names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def roles(path: Path) -> None:
    (path / "actor").mkdir()
    (path / "actor" / "shard.bin").write_bytes(b"x" * 4096)


# ---- unwrapping ------------------------------------------------------------------------------------
def test_the_enospc_inside_dcps_checkpoint_exception_is_found():
    exc = _dcp_failure()
    assert not isinstance(exc, Exception)  # a BaseException: `except Exception` misses it
    found = disk_space.find_disk_full(exc)
    assert isinstance(found, OSError) and found.errno == errno.ENOSPC
    assert (
        disk_space.find_disk_full(CheckpointException("write", {0: _wrap_exception(ValueError("x"))})) is None
    )
    remote = WorkerError("policy", "save_checkpoint", 1, "DiskFullError: checkpoint /x: no space", "tb")
    assert disk_space.find_disk_full(remote) is remote


def test_another_dcp_failure_is_one_line_naming_path_and_rank(tmp_path):
    exc = CheckpointException("write", {0: _wrap_exception(ValueError("bad shard\nmore"))})
    err = disk_space.save_failure(tmp_path / "actor", exc, 100, rank=0)
    assert not isinstance(err, DiskFullError)
    assert str(err) == f"saving checkpoint {tmp_path / 'actor'} on rank 0 failed: ValueError: bad shard"


# ---- the engine's DCP save (worker side) -------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from rlctl.engines.fsdp_train import FSDPTrainEngine
    from rlctl.engines.optim import OptimConfig
    from tests.engines.helpers import make_batch, make_model, token_mean_loss

    path = make_model(tmp_path_factory.mktemp("disk-full-model") / "m", layers=1)
    eng = FSDPTrainEngine(str(path), micro_batch_size=8, optim=OptimConfig(lr=1e-2))
    eng.train_batch(make_batch(8, seed=1), token_mean_loss)  # optimizer state exists
    return eng


def test_enospc_inside_dcp_is_one_line_with_space_needed_and_free(engine, tmp_path, monkeypatch):
    import torch.distributed.checkpoint.filesystem as fs

    def full(*args, **kwargs):
        raise _enospc(str(tmp_path / "actor" / "__0_0.distcp"))

    monkeypatch.setattr(fs, "_write_item", full)
    with pytest.raises(DiskFullError) as info:
        engine.save_checkpoint(tmp_path / "actor")
    msg = str(info.value)
    _one_line(msg)
    assert msg.startswith(f"checkpoint {tmp_path / 'actor'}: no space left on device writing ")
    needed = disk_space.state_bytes(fsdp_io.checkpoint_state(engine.model, engine.optimizer))
    assert needed > 0 and f"({needed} bytes, this save's state on all ranks" in msg
    assert "free there (shutil.disk_usage)" in msg


# ---- the run-directory save (driver side) ------------------------------------------------------------
def test_a_worker_that_filled_the_disk_is_one_line_and_the_previous_checkpoint_stays(tmp_path):
    ck.save_checkpoint(tmp_path, 2, {"step": 2}, roles, keep=2, lineage="aaa")
    before = disk_space.tree_bytes(tmp_path / "checkpoints/step_000002")

    def full(path: Path) -> None:
        roles(path)
        reason = "DiskFullError: checkpoint x: no space left on device; needs about 1.0 KB (1024 bytes, s)"
        raise WorkerError("policy", "save_checkpoint", 1, reason, "Traceback ...\nOSError: [Errno 28]")

    with pytest.raises(DiskFullError) as info:
        ck.save_checkpoint(tmp_path, 4, {"step": 4}, full, keep=1, lineage="aaa")
    msg = str(info.value)
    _one_line(msg)
    root = tmp_path / "checkpoints"
    assert msg.startswith(f"checkpoint {root / 'step_000004'}: no space left on device (role=policy rank=1 ")
    assert f"needs about {disk_space.human(before)} (the size of step_000002)" in msg
    assert f"free on {root}" in msg and "step_000002 is kept" in msg
    assert names(root) == ["step_000002"], "no partial directory left, the earlier one untouched"
    ck.verify_files(root / "step_000002")
    assert ck.find_resume_point(tmp_path, "auto") == root / "step_000002"


def test_enospc_writing_the_driver_state_with_no_earlier_checkpoint(tmp_path, monkeypatch):
    real_save = torch.save

    def save(obj, f, *a, **kw):
        real_save(obj, f, *a, **kw)
        raise _enospc(str(getattr(f, "name", f)))

    monkeypatch.setattr(ck.torch, "save", save)
    with pytest.raises(DiskFullError) as info:
        ck.save_checkpoint(tmp_path, 1, {"step": 1}, roles, keep=2, lineage="aaa")
    msg = str(info.value)
    _one_line(msg)
    assert "at least what was written before the disk filled" in msg and ck.DRIVER_FILE in msg
    assert names(tmp_path / "checkpoints") == []


def test_a_failed_resave_of_a_step_keeps_its_earlier_copy(tmp_path):
    ck.save_checkpoint(tmp_path, 2, {"step": 2, "v": 1}, roles, keep=2, lineage="aaa")

    def full(path: Path) -> None:
        raise _enospc()

    with pytest.raises(DiskFullError, match="step_000002 is kept"):
        ck.save_checkpoint(tmp_path, 2, {"step": 2, "v": 2}, full, keep=2, lineage="aaa")
    assert names(tmp_path / "checkpoints") == ["step_000002"]
    assert ck.load_driver_state(tmp_path / "checkpoints/step_000002")["v"] == 1


# ---- a real full disk: a tmpfs of a few MB -----------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """Mount a tmpfs of ``size`` bytes at a fresh directory (skip where mounting is not allowed)."""
    mounted: list[Path] = []

    def mount(size: int, where: Path | None = None) -> Path:
        where = where or tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
        where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_real_full_disk_keeps_the_previous_checkpoint(engine, small_disk, tmp_path):
    probe = tmp_path / "probe"
    engine.save_checkpoint(probe)
    size = disk_space.tree_bytes(probe)
    run = small_disk(int(size * 1.6))  # one checkpoint fits, a second beside it does not

    def write_roles(path: Path) -> None:
        engine.save_checkpoint(path / "actor")

    first = ck.save_checkpoint(run, 1, {"step": 1}, write_roles, keep=2, lineage="aaa")
    try:
        ck.save_checkpoint(run, 2, {"step": 2}, write_roles, keep=2, lineage="aaa")
    except DiskFullError as exc:
        msg = str(exc)
    except BaseException:
        pytest.fail(f"not a DiskFullError: {traceback.format_exc()}")
    else:
        pytest.fail("the save did not fill the disk")
    _one_line(msg)
    assert f"checkpoint {run / 'checkpoints/step_000002'}: no space left on device" in msg
    assert "(the size of step_000001)" in msg and "step_000001 is kept" in msg
    assert names(run / "checkpoints") == ["step_000001"]
    ck.verify_files(first)
    engine.load_checkpoint(first / "actor")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["inprocess", "ray"])
def test_rlctl_train_on_a_full_disk_says_so_in_one_line(write_profile, small_disk, backend):
    if backend == "ray":
        pytest.importorskip("ray")
    profile = write_profile(steps=2, backend=backend)
    runs = Path(str(profile.read_text()).split('output_dir = "')[1].split('"')[0])
    mount = small_disk(3 << 20, runs)  # the logs fit; the 1M-parameter model's checkpoint does not
    code, _, err = run_cli("train", str(profile))
    assert code == 1, err
    lines = [line for line in err.strip().splitlines() if line.startswith("rlctl: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    line = lines[0]
    assert "checkpoint " in line and "step_000002: no space left on device" in line, line
    assert "(role=policy rank=0 method=save_checkpoint)" in line, line
    assert "MB (the state the workers were writing)" in line and "free on" in line, line
    ckpts = next(mount.iterdir()) / "checkpoints"
    assert not [n for n in names(ckpts) if n.startswith(".tmp_")], names(ckpts)
