"""Run-directory checkpoints: atomic saves that survive ``kill -9``, rotation within one lineage,
``--resume auto|never|PATH``, and a fresh start that moves an earlier run's checkpoints aside."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest
import torch

from rlctl.errors import UserError
from rlctl.trainer.state import checkpoint as ck
from tests.cli_runner import run_cli


class Recorder:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict]] = []

    def warning(self, event: str, **kw) -> None:
        self.warnings.append((event, kw))

    def info(self, event: str, **kw) -> None:
        pass


@pytest.fixture
def logged(monkeypatch) -> Recorder:
    rec = Recorder()
    monkeypatch.setattr(ck, "log", rec)
    return rec


def roles(path: Path) -> None:
    (path / "actor").mkdir()
    (path / "actor" / "shard.bin").write_bytes(b"x" * 16)


def save(run_dir: Path, step: int, lineage: str, keep: int = 2) -> Path:
    return ck.save_checkpoint(run_dir, step, {"step": step}, roles, keep, lineage)


def names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def steps_in(root: Path) -> list[int]:
    return [int(n.split("_")[1]) for n in names(root) if n.startswith("step_")]


# ---- save_checkpoint ----------------------------------------------------------------------------------
def test_save_writes_parts_then_driver_state_under_a_temp_name(tmp_path):
    seen = []

    def write(path: Path) -> None:
        seen.append(path.name)
        assert not path.name.startswith("step_"), "roles write where resume cannot see a partial save"
        roles(path)

    final = ck.save_checkpoint(tmp_path, 7, {"step": 7, "x": 1}, write, keep=3, lineage="aaa")
    assert final == tmp_path / "checkpoints/step_000007" and seen[0].startswith(".tmp_step_000007")
    state = ck.load_driver_state(final)
    assert state == {"step": 7, "x": 1, "lineage": "aaa", "format": ck.FORMAT}
    assert (final / "actor/shard.bin").read_bytes() == b"x" * 16
    assert names(tmp_path / "checkpoints") == ["step_000007"]


def test_a_failing_role_write_leaves_the_previous_checkpoint_latest(tmp_path):
    save(tmp_path, 2, "aaa")

    def broken(path: Path) -> None:
        roles(path)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        ck.save_checkpoint(tmp_path, 4, {"step": 4}, broken, keep=2, lineage="aaa")
    assert ck.find_resume_point(tmp_path, "auto") == tmp_path / "checkpoints/step_000002"
    save(tmp_path, 4, "aaa")  # the next save clears the leftover temp directory
    assert names(tmp_path / "checkpoints") == ["step_000002", "step_000004"]


def test_saving_a_step_again_replaces_it(tmp_path):
    save(tmp_path, 2, "aaa")
    ck.save_checkpoint(tmp_path, 2, {"step": 2, "v": 2}, roles, keep=2, lineage="aaa")
    assert ck.load_driver_state(tmp_path / "checkpoints/step_000002")["v"] == 2
    assert names(tmp_path / "checkpoints") == ["step_000002"]


# ---- rotation -----------------------------------------------------------------------------------------
def test_rotation_keeps_the_newest_of_its_own_lineage_by_step(tmp_path):
    for step in (300, 400):
        save(tmp_path, step, "old")
    for step in (10, 20, 30, 40, 50):
        save(tmp_path, step, "new", keep=2)
    # today's bug: names sort the old run last, so the new run's just-written checkpoint was removed
    assert steps_in(tmp_path / "checkpoints") == [40, 50, 300, 400]
    assert ck.rotate(tmp_path, "old", keep=1) == [tmp_path / "checkpoints/step_000300"]
    assert steps_in(tmp_path / "checkpoints") == [40, 50, 400]


def test_rotation_reports_what_it_cannot_remove(tmp_path, logged, monkeypatch):
    for step in (1, 2):
        save(tmp_path, step, "aaa")
    real = os.replace

    def refuse(src, dst):
        if Path(src).name == "step_000001":
            raise PermissionError(13, "Permission denied", str(src))
        return real(src, dst)

    monkeypatch.setattr(ck.os, "replace", refuse)
    save(tmp_path, 3, "aaa")
    assert steps_in(tmp_path / "checkpoints") == [1, 2, 3]
    event, kw = logged.warnings[0]
    assert event == "could not remove old checkpoint" and kw["path"].endswith("step_000001")
    assert "Permission denied" in kw["error"]


def test_a_failed_delete_is_logged_not_hidden(tmp_path, logged, monkeypatch):
    save(tmp_path, 1, "aaa")

    def rmtree(path, onerror=None, onexc=None):
        handler = onexc or onerror
        exc = OSError(16, "Device or resource busy")
        handler(os.unlink, str(path), exc if onexc else (OSError, exc, None))

    monkeypatch.setattr(ck.shutil, "rmtree", rmtree)
    save(tmp_path, 2, "aaa", keep=1)
    trash = str(tmp_path / f"checkpoints/.del_step_000001_{os.getpid()}")
    assert (
        "could not delete",
        {"path": trash, "error": "[Errno 16] Device or resource busy"},
    ) in logged.warnings
    assert ck.find_resume_point(tmp_path, "auto") == tmp_path / "checkpoints/step_000002"


# ---- --resume auto | never | PATH ----------------------------------------------------------------------
def start(run_dir: Path, resume: str) -> ck.ResumePlan:
    return ck.prepare_resume(run_dir, resume)


def test_resume_never_after_an_old_run_then_auto_resumes_the_new_run(tmp_path, logged):
    """The issue's reproduction: an old run with steps 300/400, a new ``--resume never`` run to
    step 50, then ``--resume auto``: it must resume the new run at step 50, the old one kept."""
    old = start(tmp_path, "auto")
    for step in (300, 400):
        save(tmp_path, step, old.lineage)
    (tmp_path / "metrics.jsonl").write_text('{"step": 400}\n')

    new = start(tmp_path, "never")
    assert new.path is None and new.lineage != old.lineage
    assert new.moved_aside is not None and new.moved_aside.name.startswith("checkpoints.prev-")
    assert steps_in(new.moved_aside) == [300, 400], "the old run's checkpoints are kept, not deleted"
    moved = (
        "a fresh checkpoint lineage starts here; the previous checkpoints were moved aside",
        {"path": str(new.moved_aside)},
    )
    assert moved in logged.warnings
    kept = tmp_path / new.moved_aside.name.replace("checkpoints.", "metrics.")
    assert Path(f"{kept}.jsonl").read_text() == '{"step": 400}\n'
    assert not (tmp_path / "metrics.jsonl").exists()
    for step in (10, 20, 30, 40, 50):
        save(tmp_path, step, new.lineage)
    assert steps_in(tmp_path / "checkpoints") == [40, 50]

    again = start(tmp_path, "auto")
    assert again.path == tmp_path / "checkpoints/step_000050" and again.lineage == new.lineage
    assert again.moved_aside is None and steps_in(tmp_path / "checkpoints") == [40, 50]


def test_resume_auto_refuses_a_directory_of_several_lineages(tmp_path):
    save(tmp_path, 300, "old")
    save(tmp_path, 50, "new")
    with pytest.raises(UserError, match="several runs .*step_000050=new, step_000300=old.*--resume PATH"):
        ck.find_resume_point(tmp_path, "auto")
    # a fresh start moves the mixed directory aside instead of deleting either run
    plan = start(tmp_path, "never")
    assert steps_in(plan.moved_aside) == [50, 300] and ck.find_resume_point(tmp_path, "auto") is None


def test_checkpoints_from_before_lineages_still_resume(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (2, 4):
        (root / f"step_{step:06d}").mkdir(parents=True)
        torch.save({"step": step}, root / f"step_{step:06d}/driver.pt")
    plan = start(tmp_path, "auto")
    assert plan.path == root / "step_000004" and plan.moved_aside is None and len(plan.lineage) == 16


def test_resume_path_to_the_latest_continues_the_lineage_in_place(tmp_path):
    first = start(tmp_path, "never")
    for step in (2, 4):
        save(tmp_path, step, first.lineage)
    plan = start(tmp_path, str(tmp_path / "checkpoints/step_000004"))
    assert plan.path == tmp_path / "checkpoints/step_000004"
    assert plan.lineage == first.lineage and plan.moved_aside is None


def test_resume_path_to_an_earlier_step_moves_the_rest_aside(tmp_path):
    """Rewinding to step 2 must not let step 4 (of the abandoned continuation) win a later auto."""
    first = start(tmp_path, "never")
    for step in (2, 4):
        save(tmp_path, step, first.lineage)
    plan = start(tmp_path, str(tmp_path / "checkpoints/step_000002"))
    assert plan.path == plan.moved_aside / "step_000002" and ck.load_driver_state(plan.path)["step"] == 2
    save(tmp_path, 3, plan.lineage)
    assert ck.find_resume_point(tmp_path, "auto") == tmp_path / "checkpoints/step_000003"
    assert steps_in(plan.moved_aside) == [2, 4]


def test_resume_path_from_another_run_dir(tmp_path):
    other = start(tmp_path / "a", "never")
    save(tmp_path / "a", 6, other.lineage)
    mine = start(tmp_path / "b", "never")
    save(tmp_path / "b", 2, mine.lineage)
    plan = start(tmp_path / "b", str(tmp_path / "a/checkpoints/step_000006"))
    assert plan.path == tmp_path / "a/checkpoints/step_000006" and plan.lineage == other.lineage
    assert steps_in(plan.moved_aside) == [2] and steps_in(tmp_path / "a/checkpoints") == [6]


def test_what_cannot_carry_over_is_refused_in_one_line(tmp_path):
    ck.check_carries_over(tmp_path, {"roles": ["policy"], "world_size": 2}, ["policy"])  # any world size
    with pytest.raises(UserError, match=r"holds no critic state \(saved roles: policy\)"):
        ck.check_carries_over(tmp_path, {"roles": ["policy"]}, ["policy", "critic"])
    (tmp_path / "actor").mkdir()  # format 1: roles read from the sub-directories
    with pytest.raises(UserError, match="holds no critic state"):
        ck.check_carries_over(tmp_path, {}, ["policy", "critic"])
    with pytest.raises(UserError, match="has format 99"):
        ck.check_carries_over(tmp_path, {"format": 99}, ["policy"])


@pytest.mark.parametrize("kind", ["missing", "no-driver", "corrupt"])
def test_a_bad_resume_path_is_one_line(tmp_path, kind):
    path = tmp_path / "ckpt"
    if kind != "missing":
        path.mkdir()
    if kind == "corrupt":
        (path / "driver.pt").write_bytes(b"not a pickle")
    with pytest.raises(UserError) as info:
        ck.find_resume_point(tmp_path, str(path))
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_cli_refuses_a_bad_resume_path_before_starting(write_profile, tmp_path):
    profile = write_profile("bad-resume", steps=2)
    code, _, err = run_cli("train", str(profile), "--resume", str(tmp_path / "nowhere"))
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "nowhere" in lines[0] and "not a checkpoint directory" in lines[0], err
    assert not (tmp_path / "runs/bad-resume").exists()


# ---- kill -9 during a real save ------------------------------------------------------------------------
def _weights(engine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.model.state_dict().items()}


def _saving_child(model_dir: str, run_dir: str, point: str) -> None:
    """Two good saves (steps 1, 2) of a real tiny FSDP engine, then a third save killed at ``point``."""
    from rlctl.engines.fsdp_train import FSDPTrainEngine
    from rlctl.engines.optim import OptimConfig
    from tests.engines.helpers import make_batch, token_mean_loss

    run = Path(run_dir)
    engine = FSDPTrainEngine(model_dir, micro_batch_size=8, optim=OptimConfig(lr=1e-2))

    def write_roles(path: Path) -> None:
        engine.save_checkpoint(path / "actor")
        if os.environ.get(ck.KILL_AT_ENV) == "between_roles":
            os.kill(os.getpid(), 9)
        engine.save_checkpoint(path / "critic")

    plan = ck.prepare_resume(run, "never")
    for step in (1, 2, 3):
        engine.train_batch(make_batch(8, seed=step), token_mean_loss)
        torch.save(_weights(engine), run / f"weights_{step}.pt")
        if step == 3:
            os.environ[ck.KILL_AT_ENV] = point
        again = 2 if point == "old_moved" and step == 3 else step  # a re-save of step 2
        ck.save_checkpoint(run, again, {"step": again}, write_roles, keep=2, lineage=plan.lineage)
    os._exit(3)  # not killed: the point was never reached


# where the kill lands -> the checkpoint a resume must find afterwards
KILLS = {
    "tmp_created": 2,
    "between_roles": 2,
    "roles_written": 2,
    "driver_written": 2,
    "old_moved": 1,  # step 2's old copy is out of the step_* namespace, its new one not yet in
    "renamed": 3,
    "rotating": 3,  # step 1 renamed for deletion, half deleted
}


@pytest.fixture(scope="module")
def engine_model(tmp_path_factory) -> str:
    from tests.engines.helpers import make_model

    return str(make_model(tmp_path_factory.mktemp("ckpt-model") / "m", layers=1))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", list(KILLS))
def test_kill_9_during_a_real_save_leaves_the_previous_checkpoint_loadable(engine_model, tmp_path, point):
    from rlctl.engines.fsdp_train import FSDPTrainEngine
    from rlctl.engines.optim import OptimConfig

    assert point in ck.KILL_POINTS or point == "between_roles"
    # spawn, not fork: a fork of a test process that already runs threads (Ray, thread pools) can
    # deadlock on a lock held by another thread at the moment of the fork
    child = multiprocessing.get_context("spawn").Process(
        target=_saving_child, args=(engine_model, str(tmp_path), point)
    )
    child.start()
    child.join(100)
    if child.is_alive():  # never leave it behind, whatever went wrong
        child.kill()
        child.join()
    assert child.exitcode == -9, f"the save was not killed at {point} (exit {child.exitcode})"

    found = ck.find_resume_point(tmp_path, "auto")
    assert found == tmp_path / f"checkpoints/step_{KILLS[point]:06d}"
    resumed = FSDPTrainEngine(engine_model, micro_batch_size=8, optim=OptimConfig(lr=1e-2))
    resumed.load_checkpoint(found / "actor")
    expected = torch.load(tmp_path / f"weights_{KILLS[point]}.pt")
    for name, value in _weights(resumed).items():
        assert torch.equal(value, expected[name]), name
    # the run continues: the next save succeeds and clears what the killed one left behind
    save(tmp_path, 9, ck.load_driver_state(found)["lineage"])
    assert all(n.startswith("step_") for n in names(tmp_path / "checkpoints")), "leftovers cleared"
    assert ck.find_resume_point(tmp_path, "auto") == tmp_path / "checkpoints/step_000009"
