"""A checkpoint written by 2 FSDP ranks continues on 1 rank, on the uninterrupted run's curve."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlctl.engines.fsdp_io import EXTRA_STATE
from rlctl.trainer.state import checkpoint as ck
from tests.cli_runner import run_cli
from tests.trainer.test_train_e2e import DETERMINISTIC, by_step, metrics

# Discrete metrics: the same prompts (data position) decoded by weights that differ only by float
# reduction order (~1e-7) give the same tokens, so these match exactly.
DISCRETE = ("reward/score_mean", "reward/accuracy", "response_length/mean", "val/accuracy")


def _profile(write_profile, name: str, backend: str, ranks: int) -> Path:
    """The tiny GRPO profile, decoding with top_k = 1 and moving the weights by an entropy bonus.

    top_k = 1: sampling seeds are per DP rank (``seed * 1_000_003 + rank`` in
    ``PolicyWorker.generate_sequences``), so sampled tokens depend on the world size; argmax
    decoding takes the RNG out of the rollout and leaves the trained state as the only thing
    that can move the curve. With every group's rewards equal, the entropy bonus (large lr)
    is what moves the weights, through a resharded Adam state.
    """
    path = write_profile(name, backend=backend, steps=3)
    actor = "micro_batch_sequences = 8\nentropy_coeff = 0.01"
    text = path.read_text().replace("[cluster]", f"[cluster]\ndevices_per_node = {ranks}")
    text = text.replace("micro_batch_sequences = 8", actor).replace("lr = 1e-4", "lr = 1e-2")
    path.write_text(text.replace("max_new_tokens = 4", "max_new_tokens = 4\ntop_k = 1"))
    return path


def _engine_weights(model_dir: str, ckpt: Path) -> dict[str, torch.Tensor]:
    from rlctl.engines.fsdp_train import FSDPTrainEngine

    engine = FSDPTrainEngine(model_dir)
    engine.load_checkpoint(ckpt / "actor")
    return {k: v.detach().clone() for k, v in engine.model.state_dict().items()}


@pytest.mark.timeout(600)
def test_two_rank_checkpoint_resumes_on_one_rank_on_the_same_curve(
    write_profile, tmp_path, tiny_model, ray_session
):
    """Run A: 3 steps on 2 FSDP ranks (Ray), checkpoints at steps 2 and 3. Run B: 1 rank
    (in-process), ``--resume`` from A's step-2 checkpoint, step 3 (DCP reshards 2 -> 1).

    Expected exactly equal: the logged steps, the learning rate, and in the step-3 checkpoints
    the data position, driver RNG, KL controller, step count, LR scheduler state and optimiser
    step count. Expected equal to 1e-4 relative (world 2 sums gradients across ranks in another
    order than world 1): losses, grad norm, entropy, KL, and the step-3 weights (to 1e-5
    absolute; they come from an Adam step on the resharded optimiser state). The discrete metrics
    (scores, accuracy, response lengths) match exactly, see ``DISCRETE``.
    """
    two = _profile(write_profile, "two-ranks", "ray", 2)
    code, _, err = run_cli("train", str(two))
    assert code == 0, err
    a_dir = tmp_path / "runs/two-ranks/checkpoints"
    assert ck.load_driver_state(a_dir / "step_000002")["world_size"] == 2

    one = _profile(write_profile, "one-rank", "inprocess", 1)
    code, _, err = run_cli("train", str(one), "--resume", str(a_dir / "step_000002"))
    assert code == 0, err
    b_dir = tmp_path / "runs/one-rank/checkpoints"

    a, b = by_step(metrics(tmp_path / "runs/two-ranks")), by_step(metrics(tmp_path / "runs/one-rank"))
    assert sorted(b) == [3], "the resumed run continues at step 3"
    assert b[3]["actor/lr"] == a[3]["actor/lr"]
    for key in DETERMINISTIC:
        if key in DISCRETE:
            assert b[3].get(key) == a[3].get(key), key
        elif key in a[3]:
            assert b[3][key] == pytest.approx(a[3][key], rel=1e-4, abs=1e-6), key

    sa, sb = ck.load_driver_state(a_dir / "step_000003"), ck.load_driver_state(b_dir / "step_000003")
    assert (sa["world_size"], sb["world_size"]) == (2, 1)
    assert sb["lineage"] == sa["lineage"], "a resume continues the lineage it was saved in"
    for key in ("step", "data", "kl_ctrl"):
        assert sb[key] == sa[key], key
    assert torch.equal(sb["rng"]["torch"], sa["rng"]["torch"])
    assert sb["rng"]["python"] == sa["rng"]["python"]
    assert all(
        (x == y).all() if hasattr(x, "all") else x == y
        for x, y in zip(sb["rng"]["numpy"], sa["rng"]["numpy"], strict=True)
    )
    ea, eb = (torch.load(d / "step_000003/actor" / EXTRA_STATE, weights_only=False) for d in (a_dir, b_dir))
    assert eb["scheduler"] == ea["scheduler"] and eb["global_step"] == ea["global_step"] == 3

    wa = _engine_weights(tiny_model, a_dir / "step_000003")
    wb = _engine_weights(tiny_model, b_dir / "step_000003")
    at_two = _engine_weights(tiny_model, a_dir / "step_000002")
    assert any(not torch.equal(wa[k], at_two[k]) for k in wa), "step 3 moved the weights"
    for name, value in wa.items():
        torch.testing.assert_close(wb[name], value, rtol=1e-4, atol=1e-5, msg=name)

    # what cannot carry over is refused before anything moves: a GRPO checkpoint has no critic
    ppo = write_profile("as-ppo", preset="ppo", steps=4)
    code, _, err = run_cli("train", str(ppo), "--resume", str(a_dir / "step_000002"))
    assert code == 2, err
    last = err.strip().splitlines()[-1]
    assert "holds no critic state" in last and "step_000002" in last, last
