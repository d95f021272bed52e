"""bf16/fp16 compute over fp32 master weights: updates at lr 1e-6 survive, in one process and on 2 ranks.

Pure bf16 storage is the bug being fixed: an AdamW step of ~1e-6 on weights of ~0.2 is below half a
bf16 ulp (~4e-4) and rounds away, so the model never moves. The tests show both sides.
"""

from __future__ import annotations

import os

import pytest
import torch

from rlctl.dispatch.local_ranks import spawn_ranks
from rlctl.engines.fsdp_train import FSDPTrainEngine
from rlctl.engines.mixed_precision import DynamicLossScaler, compute_dtype
from rlctl.engines.optim import OptimConfig
from rlctl.errors import UserError
from tests.engines.helpers import free_port, make_batch, make_model, token_mean_loss

torch.set_num_threads(1)
LR = OptimConfig(lr=1e-6, grad_clip=1.0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("mp") / "model", tie=False, seed=5)


def _weights(engine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.export_weights("full")}


def _step_report(engine, batch) -> dict:
    """One lr-1e-6 step; what moved, in which dtype compute ran and what is stored."""
    seen: dict[str, torch.dtype] = {}
    linear = next(m for n, m in engine.model.named_modules() if n.endswith("layers.0.self_attn.q_proj"))
    hook = linear.register_forward_hook(lambda m, i, o: seen.setdefault("q_proj", o.dtype) and None)
    before = _weights(engine)
    metrics = engine.train_batch(batch, token_mean_loss)
    hook.remove()
    after = _weights(engine)
    # elements of typical size (zero-initialised biases can take a 1e-6 step even in bf16)
    sized = {k: before[k].float().abs() >= 1e-3 for k in before}
    moved = {k: int(((after[k] != before[k]) & sized[k]).sum()) for k in before}
    delta = max(float((after[k].float() - before[k].float()).abs().max()) for k in before)
    state = next(iter(engine.optimizer.state.values()))
    return {
        "metrics": metrics,
        "compute": str(seen["q_proj"]),
        "param_dtype": str(next(engine.model.parameters()).dtype),
        "optim_dtype": str(state["exp_avg"].dtype),
        "moved_fraction": sum(moved.values()) / sum(int(v.sum()) for v in sized.values()),
        "max_delta": delta,
        "log_prob_dtype": str(engine.compute_log_prob(batch)["log_probs"].dtype),
    }


def _check_master_moves(r: dict) -> None:
    assert r["compute"] == "torch.bfloat16"  # bf16 compute really happened
    assert r["param_dtype"] == r["optim_dtype"] == "torch.float32"
    assert r["log_prob_dtype"] == "torch.float32"
    assert r["metrics"]["grad_norm"] > 0 and r["metrics"]["skipped"] == 0
    assert r["moved_fraction"] > 0.5  # most weights took the step (unused embedding rows do not)
    assert 0.5e-6 < r["max_delta"] < 2e-6  # an Adam step of size lr


def _check_pure_bf16_is_stuck(r: dict) -> None:
    assert r["param_dtype"] == r["optim_dtype"] == "torch.bfloat16"
    assert r["metrics"]["grad_norm"] > 0 and r["metrics"]["skipped"] == 0  # a step was taken...
    assert r["moved_fraction"] == 0.0  # ...and rounded away on every weight of size >= 1e-3


def test_bf16_compute_fp32_master_moves_weights_at_lr_1e6(model_dir):
    engine = FSDPTrainEngine(
        model_dir, dtype="float32", mixed_precision="bfloat16", micro_batch_size=4, optim=LR
    )
    _check_master_moves(_step_report(engine, make_batch(8, seed=1)))


def test_pure_bf16_storage_does_not_move_weights_at_lr_1e6(model_dir):
    engine = FSDPTrainEngine(model_dir, dtype="bfloat16", mixed_precision=None, micro_batch_size=4, optim=LR)
    _check_pure_bf16_is_stuck(_step_report(engine, make_batch(8, seed=1)))


def _worker(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        rows = slice(rank * 4, (rank + 1) * 4)
        batch = {k: v[rows] for k, v in make_batch(8, seed=1).items()}
        mixed = FSDPTrainEngine(model_dir, dtype="float32", mixed_precision="bfloat16", optim=LR)
        pure = FSDPTrainEngine(model_dir, dtype="bfloat16", optim=LR)
        critic = FSDPTrainEngine(model_dir, value_head=True, mixed_precision="bfloat16", optim=LR)
        seen = []
        critic.model.value_head.register_forward_hook(lambda m, i, o: seen.append((i[0].dtype, o.dtype)))
        values = critic.compute_values(batch)
        result = {
            "mixed": _step_report(mixed, batch),
            "pure": _step_report(pure, batch),
            "critic": {"values": str(values.dtype), "head": [str(d) for d in seen[0]]},
        }
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(240)
def test_two_ranks_over_gloo_bf16_compute_fp32_master(model_dir, tmp_path):
    """FSDP2's MixedPrecisionPolicy (bf16 all-gather, fp32 reduce-scatter) over gloo."""
    spawn_ranks(_worker, 2, (2, free_port(), str(model_dir), str(tmp_path)))
    for rank in range(2):
        r = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        _check_master_moves(r["mixed"])
        _check_pure_bf16_is_stuck(r["pure"])
        assert r["critic"] == {"values": "torch.float32", "head": ["torch.float32", "torch.float32"]}


def test_value_head_runs_in_fp32_under_autocast(model_dir):
    critic = FSDPTrainEngine(model_dir, value_head=True, mixed_precision="bfloat16")
    seen = []
    critic.model.value_head.register_forward_hook(lambda m, i, o: seen.append((i[0].dtype, o.dtype)))
    backbone_out = []
    critic.model.backbone.layers[0].mlp.down_proj.register_forward_hook(
        lambda m, i, o: backbone_out.append(o.dtype)
    )
    values = critic.compute_values(make_batch(4, seed=2))
    assert values.dtype == torch.float32
    assert seen[0] == (torch.float32, torch.float32) and backbone_out[0] == torch.bfloat16


def test_checkpoint_resume_and_exports_under_mixed_precision(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from rlctl.engines.hf_rollout import HFRolloutEngine

    kw = dict(dtype="float32", mixed_precision="bfloat16", micro_batch_size=4, optim=LR)
    b1, b2 = make_batch(8, seed=1), make_batch(8, seed=2)
    engine = FSDPTrainEngine(model_dir, **kw)
    engine.train_batch(b1, token_mean_loss)
    engine.save_checkpoint(tmp_path / "ckpt")
    engine.train_batch(b2, token_mean_loss)
    resumed = FSDPTrainEngine(model_dir, **kw)
    resumed.load_checkpoint(tmp_path / "ckpt")
    resumed.train_batch(b2, token_mean_loss)
    master = _weights(engine)
    for k, v in _weights(resumed).items():
        assert torch.equal(v, master[k]), k
    # HF export keeps the storage dtype: the fp32 master weights, not their bf16 rounding
    engine.save_hf(tmp_path / "hf")
    state = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).state_dict()
    for k, v in master.items():
        assert torch.equal(state[k], v), k
    # weight sync: the rollout stores the compute dtype and casts on update
    low = dict(engine.export_weights("full", dtype=torch.bfloat16))
    assert all(
        v.dtype == torch.bfloat16 and torch.equal(v, master[k].to(torch.bfloat16)) for k, v in low.items()
    )
    rollout = HFRolloutEngine(model_dir, dtype="bfloat16")
    rollout.update_weights(engine.export_weights("full"))
    for k, v in rollout.model.named_parameters():
        assert v.dtype == torch.bfloat16 and torch.equal(v, master[k].to(torch.bfloat16)), k


def test_fp16_compute_uses_a_dynamic_loss_scale(model_dir, tmp_path):
    """fp16 gradients of a small loss underflow without a scale; with one they match fp32's."""

    def tiny(outputs, mb, scale):
        loss, metrics = token_mean_loss(outputs, mb, scale)
        return loss * 1e-6, metrics

    batch = make_batch(8, seed=1)
    fp32 = FSDPTrainEngine(model_dir, optim=OptimConfig(lr=0.0, grad_clip=0.0)).train_batch(batch, tiny)
    fp16 = FSDPTrainEngine(model_dir, mixed_precision="float16", optim=OptimConfig(lr=0.0, grad_clip=0.0))
    scaled = fp16.train_batch(batch, tiny)
    assert scaled["loss_scale"] == 2.0**16 and scaled["skipped"] == 0
    assert abs(scaled["grad_norm"] - fp32["grad_norm"]) < 0.05 * fp32["grad_norm"]
    fp16.loss_scaler = None
    unscaled = fp16.train_batch(batch, tiny)
    assert abs(unscaled["grad_norm"] - fp32["grad_norm"]) > 0.2 * fp32["grad_norm"]  # what the scale prevents

    # an overflow skips the step and halves the scale; the scale is part of the checkpoint
    def huge(outputs, mb, scale):
        loss, metrics = token_mean_loss(outputs, mb, scale)
        return loss * 1e4, metrics

    engine = FSDPTrainEngine(model_dir, mixed_precision="float16", optim=LR)
    before = _weights(engine)
    out = engine.train_batch(batch, huge)
    assert out["skipped"] == 1 and engine.loss_scaler.scale == 2.0**15
    assert all(torch.equal(v, before[k]) for k, v in _weights(engine).items())
    out = engine.train_batch(batch, token_mean_loss)
    assert out["skipped"] == 0 and any(not torch.equal(v, before[k]) for k, v in _weights(engine).items())
    engine.save_checkpoint(tmp_path / "ckpt")
    resumed = FSDPTrainEngine(model_dir, mixed_precision="float16", optim=LR)
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert (
        resumed.loss_scaler.state_dict()
        == engine.loss_scaler.state_dict()
        == {"scale": 2.0**15, "good_steps": 1}
    )


def test_loss_scaler_grows_after_clean_steps():
    s = DynamicLossScaler(init_scale=8.0, growth_interval=2)
    s.update(found_inf=False)
    assert s.scale == 8.0
    s.update(found_inf=False)
    assert s.scale == 16.0
    s.update(found_inf=True)
    assert s.scale == 8.0 and s.good_steps == 0


def test_compute_dtype_policy():
    assert compute_dtype("float32", None) is None
    assert compute_dtype("float32", "float32") is None
    assert compute_dtype("float32", "bf16") == torch.bfloat16
    assert compute_dtype("bfloat16", "bfloat16") is None  # the frozen reference: stored as computed
    with pytest.raises(UserError, match="mixed_precision='float16' over dtype='bfloat16'"):
        compute_dtype("bfloat16", "float16")
