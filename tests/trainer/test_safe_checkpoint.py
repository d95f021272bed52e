"""Resuming never runs code from a checkpoint: crafted pickles are refused in one line, unrun."""

from __future__ import annotations

import io
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from rlctl.engines.safe_checkpoint import SafeLoadPlanner, check_dcp_metadata, safe_torch_load
from rlctl.errors import CheckpointRefused, UserError
from rlctl.trainer.state import checkpoint as ck
from rlctl.trainer.state import manifest
from tests.cli_runner import run_cli


class Marker:
    """Unpickling this writes a file: the proof that a load ran code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.write_text, (self.path, "ran"))


def crafted_checkpoint(run_dir: Path, marker: Path) -> Path:
    step = ck.checkpoint_root(run_dir) / "step_000002"
    (step / "actor").mkdir(parents=True)
    torch.save({"step": 2, "lineage": "x", "format": 3, "payload": Marker(marker)}, step / ck.DRIVER_FILE)
    return step


@pytest.mark.parametrize("resume", ["auto", "never", "PATH"])
def test_a_crafted_driver_state_runs_nothing_and_is_refused(tmp_path, resume):
    marker = tmp_path / "marker"
    step = crafted_checkpoint(tmp_path / "run", marker)
    with pytest.raises(UserError, match=r"driver.pt: refused, not loaded"):
        ck.prepare_resume(tmp_path / "run", str(step) if resume == "PATH" else resume)
    assert not marker.exists()


def test_the_cli_refuses_it_in_one_line(tmp_path):
    marker = tmp_path / "marker"
    step = crafted_checkpoint(tmp_path / "runs/t", marker)
    profile = tmp_path / "p.toml"
    profile.write_text(
        f'[run]\nname = "t"\noutput_dir = "{tmp_path / "runs"}"\n[model]\npath = "builtin:tiny-1m"\n'
        '[data]\ntrain = "builtin:addition"\n[trainer]\nsteps = 3\nloggers = ["jsonl"]\n'
    )
    code, _, err = run_cli("train", str(profile), "--resume", str(step))
    assert code == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and "refused, not loaded" in err
    assert not marker.exists()


def test_a_crafted_dcp_metadata_runs_nothing(tmp_path):
    marker = tmp_path / "marker"
    (tmp_path / ".metadata").write_bytes(pickle.dumps({"state_dict_metadata": Marker(marker)}))
    with pytest.raises(
        UserError, match=r"\.metadata: refused, not loaded \(it names pathlib.Path.write_text"
    ):
        check_dcp_metadata(tmp_path)
    assert not marker.exists()


def test_a_real_dcp_metadata_passes(tmp_path):
    import torch.distributed.checkpoint as dcp

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    dcp.save(
        {"model": model.state_dict(), "optim": opt.state_dict()}, checkpoint_id=str(tmp_path), no_dist=True
    )
    check_dcp_metadata(tmp_path)
    state = {"model": torch.nn.Linear(3, 2).state_dict(), "optim": opt.state_dict()}
    dcp.load(state, checkpoint_id=str(tmp_path), planner=SafeLoadPlanner(), no_dist=True)
    assert torch.equal(state["model"]["weight"], model.weight)


def test_dcp_bytes_items_must_be_data(tmp_path):
    marker = tmp_path / "marker"
    buf = io.BytesIO()
    torch.save(Marker(marker), buf)

    class Item:
        class dest_index:
            fqn = "optim.param_groups"

    with pytest.raises(UserError, match="'optim.param_groups': refused"):
        SafeLoadPlanner().load_bytes(Item(), io.BytesIO(buf.getvalue()))
    assert not marker.exists()


def test_rng_state_round_trips_as_data_and_old_numpy_states_still_load(tmp_path):
    np.random.seed(5)
    random.seed(5)
    torch.manual_seed(5)
    torch.save({"rng": ck.rng_state()}, tmp_path / "new.pt")
    torch.save({"rng": {**ck.rng_state(), "numpy": np.random.get_state()}}, tmp_path / "format2.pt")
    expected = (np.random.rand(), random.random(), torch.rand(1).item())
    for name in ("new.pt", "format2.pt"):
        np.random.seed(0), random.seed(0), torch.manual_seed(0)
        ck.set_rng_state(safe_torch_load(tmp_path / name)["rng"])
        assert (np.random.rand(), random.random(), torch.rand(1).item()) == expected


# ---- the manifest: every file checked against what its save wrote --------------------------------
def _roles(path: Path) -> None:
    (path / "actor").mkdir()
    (path / "actor" / "__0_0.distcp").write_bytes(bytes(range(256)) * 8)


def _saved(run_dir: Path, steps=(2, 4)) -> list[Path]:
    return [ck.save_checkpoint(run_dir, s, {"step": s}, _roles, keep=5, lineage="aaa") for s in steps]


def test_a_save_records_every_file_it_wrote(tmp_path):
    (latest,) = _saved(tmp_path, steps=(3,))
    files = manifest.read_manifest(latest)
    assert sorted(files) == ["actor/__0_0.distcp", "driver.pt"]
    assert files["actor/__0_0.distcp"]["bytes"] == 2048
    assert files["driver.pt"]["sha256"] == manifest.file_sha256(latest / "driver.pt")


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "driver"])
@pytest.mark.parametrize("resume", ["auto", "PATH"])
def test_a_damaged_checkpoint_is_refused_in_one_line_not_skipped(tmp_path, damage, resume):
    _, latest = _saved(tmp_path)
    shard = latest / "actor/__0_0.distcp"
    if damage == "flip":
        data = bytearray(shard.read_bytes())
        data[100] ^= 1
        shard.write_bytes(bytes(data))
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-1])
    elif damage == "delete":
        shard.unlink()
    else:  # a driver state swapped for another data-only one: still refused
        torch.save({"step": 4, "lineage": "aaa", "format": 3, "extra": 1}, latest / ck.DRIVER_FILE)
    with pytest.raises(CheckpointRefused) as err:
        ck.prepare_resume(tmp_path, str(latest) if resume == "PATH" else resume)
    message = str(err.value)
    assert "\n" not in message and str(latest) in message and "not loaded" in message
    expected = {
        "flip": "SHA-256 mismatch",
        "truncate": "2047 bytes",
        "delete": "is missing",
        "driver": "driver.pt",
    }[damage]
    assert expected in message
    assert (latest / ck.DRIVER_FILE).exists(), "a refused checkpoint is left as it is"


def test_a_format_3_checkpoint_without_its_manifest_is_refused(tmp_path):
    _, latest = _saved(tmp_path)
    (latest / manifest.MANIFEST_FILE).unlink()
    with pytest.raises(CheckpointRefused, match="no manifest.json"):
        ck.prepare_resume(tmp_path, "auto")


def test_older_checkpoints_without_a_manifest_resume_with_a_warning(tmp_path, monkeypatch):
    warnings = []
    monkeypatch.setattr(ck.log, "warning", lambda event, **kw: warnings.append(event))
    step = tmp_path / "checkpoints/step_000002"
    step.mkdir(parents=True)
    torch.save({"step": 2, "lineage": "old", "format": 2}, step / ck.DRIVER_FILE)
    assert ck.prepare_resume(tmp_path, "auto").path == step
    assert any("not verified" in w for w in warnings)


def test_a_manifest_cannot_point_outside_its_checkpoint(tmp_path):
    _, latest = _saved(tmp_path)
    (latest / manifest.MANIFEST_FILE).write_text(
        '{"version": 1, "files": {"../../etc/passwd": {"bytes": 1, "sha256": "0"}}}'
    )
    with pytest.raises(CheckpointRefused, match="outside the checkpoint"):
        ck.prepare_resume(tmp_path, "auto")
