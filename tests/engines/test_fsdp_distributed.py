"""FSDP2 over gloo with 1 and 2 ranks against a plain HF forward and unsharded training."""

from __future__ import annotations

import os

import pytest
import torch

from tests.engines.helpers import (
    advantage_loss,
    make_batch,
    make_grouped_batch,
    make_model,
    reference_log_probs,
    spawn_per_world_size,
    token_mean_loss,
)

WORLD_SIZES = (1, 2)


def _params(engine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.export_weights("full")}


def _worker(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist

    from rlctl.engines.fsdp_train import FSDPTrainEngine
    from rlctl.engines.hf_rollout import HFRolloutEngine
    from rlctl.engines.optim import OptimConfig
    from rlctl.errors import RunError

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        optim = OptimConfig(lr=1e-2, grad_clip=1.0, warmup_steps=0, total_steps=4, schedule="cosine")
        per_rank = 8 // world
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        b1 = {k: v[rows] for k, v in make_batch(8, seed=1).items()}
        b2 = {k: v[rows] for k, v in make_batch(8, seed=2).items()}
        engine = FSDPTrainEngine(model_dir, micro_batch_size=2, optim=optim)
        result = {"log_probs": engine.compute_log_prob(b1, temperature=0.7)["log_probs"]}
        result["metrics"] = engine.train_batch(b1, token_mean_loss, temperature=0.7)
        result["step1"] = _params(engine)
        # colocated rollout: stream the gathered weights in memory, then both engines agree
        rollout = HFRolloutEngine(model_dir)
        result["synced"] = rollout.update_weights(engine.export_weights("full"))
        gen = rollout.generate(
            b1["input_ids"][:, :6],
            b1["attention_mask"][:, :6],
            temperature=0.7,
            max_new_tokens=6,
            eos_token_id=[1, *range(5, 16)],
            seed=rank,
        )
        recomputed = engine.compute_log_prob(gen, temperature=0.7)["log_probs"]
        result["colocated_diff"] = float(
            ((recomputed - gen["rollout_log_probs"]) * gen["response_mask"]).abs().max()
        )
        sharded = dict(engine.export_weights("sharded"))
        result["sharded_local_numel"] = sum(t.to_local().numel() for t in sharded.values())
        engine.save_checkpoint(os.path.join(out_dir, "ckpt"))
        engine.train_batch(b2, token_mean_loss)
        result["step2"] = _params(engine)
        engine.save_hf(os.path.join(out_dir, "hf"))

        resumed = FSDPTrainEngine(model_dir, micro_batch_size=2, optim=optim)
        resumed.load_checkpoint(os.path.join(out_dir, "ckpt"))
        result["resumed_step"] = resumed.global_step
        resumed.train_batch(b2, token_mean_loss)
        result["resumed2"] = _params(resumed)
        result["lr_after"] = (engine.scheduler.get_last_lr()[0], resumed.scheduler.get_last_lr()[0])
        ckpt = FSDPTrainEngine(model_dir, micro_batch_size=2, optim=optim, activation_checkpointing=True)
        ckpt.train_batch(b1, token_mean_loss, temperature=0.7)
        result["act_ckpt_step1"] = _params(ckpt)
        mixed = FSDPTrainEngine(model_dir, micro_batch_size=2, mixed_precision="bf16")
        result["bf16_log_probs"] = mixed.compute_log_prob(b1, temperature=0.7)["log_probs"]
        result["bf16_param_dtype"] = str(next(mixed.model.parameters()).dtype)
        # n samples per prompt: the shared-prompt forward (two passes before one backward under
        # FSDP2) against the plain one, same micro-batching
        grouped = {k: v[rows] for k, v in make_grouped_batch(2, n=4, seed=5).items()}
        for share in (True, False):
            e = FSDPTrainEngine(model_dir, micro_batch_size=2, optim=optim, share_prefix=share)
            result[f"grouped_log_probs_{share}"] = e.compute_log_prob(grouped, temperature=0.7)["log_probs"]
            e.train_batch(grouped, token_mean_loss, temperature=0.7)
            result[f"grouped_step_{share}"] = _params(e)
        # one rank shares prompts, the other does not: the ranks must still run the same forwards
        # (each is a collective), or the backward's all-gathers and reduce-scatters deadlock
        mixed = grouped if rank == 0 else {k: v[rows] for k, v in make_batch(8, seed=6).items()}
        e = FSDPTrainEngine(model_dir, micro_batch_size=4, optim=optim)
        result["mixed_log_probs"] = e.compute_log_prob(mixed, temperature=0.7)["log_probs"]
        e.train_batch(mixed, token_mean_loss, temperature=0.7)
        # rows whose advantage is 0 everywhere, skipped: rank 0 keeps one row (one micro-batch),
        # rank 1 three (two), so rank 0 runs a fill row; then a step with every row skipped
        adv = torch.tensor([1.0, 0, 0, 0, 0.5, 0, -1.0, 2.0])[rows, None].expand(-1, 5).contiguous()
        weighted = {**b1, "advantages": adv}
        for skip in (True, False):
            e = FSDPTrainEngine(model_dir, micro_batch_size=2, optim=optim)
            rows_out = (adv == 0).all(-1) if skip else None
            m = e.train_batch(weighted, advantage_loss, temperature=0.7, skip_rows=rows_out)
            result[f"skip_{skip}_step1"] = _params(e)
            result[f"skip_{skip}_frac"] = m["zero_grad_row_frac"]
            nothing = {**weighted, "advantages": torch.zeros_like(adv)}
            everything = torch.ones(len(adv), dtype=torch.bool) if skip else None
            e.train_batch(nothing, advantage_loss, temperature=0.7, skip_rows=everything)
            result[f"skip_{skip}_step2"] = _params(e)
        if world == 2:  # ranks with different micro-batch counts fail loudly instead of hanging
            uneven = {k: v[: 3 if rank == 0 else 1] for k, v in b1.items()}
            try:
                engine.compute_log_prob(uneven)
                result["uneven_error"] = None
            except RunError as exc:
                result["uneven_error"] = str(exc)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run the worker once per world size; the tests below read its outputs."""
    base = tmp_path_factory.mktemp("fsdp")
    model_dir = make_model(base / "model", tie=True, seed=3)
    return model_dir, spawn_per_world_size(_worker, base, model_dir, WORLD_SIZES)


@pytest.fixture(scope="module")
def unsharded(runs):
    """The same step on one process without torch.distributed: the reference for parameters."""
    from rlctl.engines.fsdp_train import FSDPTrainEngine
    from rlctl.engines.optim import OptimConfig

    model_dir, _ = runs
    optim = OptimConfig(lr=1e-2, grad_clip=1.0, warmup_steps=0, total_steps=4, schedule="cosine")
    engine = FSDPTrainEngine(model_dir, micro_batch_size=8, optim=optim)
    metrics = engine.train_batch(make_batch(8, seed=1), token_mean_loss, temperature=0.7)
    return metrics, _params(engine)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_log_probs_match_plain_hf_forward(runs, world):
    from transformers import AutoModelForCausalLM

    model_dir, out = runs
    ref = reference_log_probs(AutoModelForCausalLM.from_pretrained(model_dir), make_batch(8, seed=1), 0.7)
    got = torch.cat([r["log_probs"] for r in out[world]])
    mask = make_batch(8, seed=1)["response_mask"].bool()
    assert torch.allclose(got[mask], ref[mask], atol=1e-5, rtol=0)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_one_step_matches_unsharded_training(runs, unsharded, world):
    _, out = runs
    ref_metrics, ref_params = unsharded
    for r in out[world]:
        assert r["step1"].keys() == ref_params.keys()
        for name, p in ref_params.items():
            assert (r["step1"][name] - p).abs().max() <= 1e-5, name
        assert abs(r["metrics"]["grad_norm"] - ref_metrics["grad_norm"]) <= 1e-4 * ref_metrics["grad_norm"]
    # the step moved the weights (a no-op engine would pass the comparison above)
    assert any((out[world][0]["step1"][k] - out[world][0]["step2"][k]).abs().max() > 1e-4 for k in ref_params)


@pytest.mark.timeout(240)
def test_sharded_export_holds_a_shard_per_rank(runs):
    _, out = runs
    full = sum(t.numel() for t in out[1][0]["step1"].values())
    assert out[1][0]["sharded_local_numel"] == full
    assert sum(r["sharded_local_numel"] for r in out[2]) == full
    assert out[2][0]["sharded_local_numel"] < full


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_checkpoint_resume_is_bit_exact(runs, world):
    _, out = runs
    for r in out[world]:
        assert r["resumed_step"] == 1
        assert r["lr_after"][0] == r["lr_after"][1]
        for name, p in r["step2"].items():
            assert torch.equal(r["resumed2"][name], p), name


@pytest.mark.timeout(240)
def test_hf_export_reloads_with_transformers(runs):
    from transformers import AutoModelForCausalLM

    _, out = runs
    out_dir = out[2][0]["dir"]
    model = AutoModelForCausalLM.from_pretrained(out_dir / "hf")
    assert type(model).__name__ == "Qwen2ForCausalLM"
    state = model.state_dict()
    for name, p in out[2][0]["step2"].items():
        assert torch.equal(state[name], p), name
    assert torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_bf16_mixed_precision_stays_close_with_fp32_master_weights(runs, world):
    _, out = runs
    mask = make_batch(8, seed=1)["response_mask"].bool()
    fp32 = torch.cat([r["log_probs"] for r in out[world]])
    bf16 = torch.cat([r["bf16_log_probs"] for r in out[world]])
    diff = (fp32[mask] - bf16[mask]).abs().max()
    assert 0 < diff < 0.1  # bf16 compute really happened, and it is still the same model
    assert out[world][0]["bf16_param_dtype"] == "torch.float32"


@pytest.mark.timeout(240)
def test_uneven_micro_batch_counts_raise_on_every_rank(runs):
    _, out = runs
    for rank, r in enumerate(out[2]):
        assert (
            r["uneven_error"]
            and f"rank {rank}" in r["uneven_error"]
            and "between 1 and 2" in r["uneven_error"]
        )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_colocated_rollout_sees_trained_weights_without_disk(runs, world):
    _, out = runs
    for r in out[world]:
        assert r["synced"] == len(r["step1"])
        assert r["colocated_diff"] <= 1e-5


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_activation_checkpointing_under_fsdp_gives_the_same_step(runs, world):
    _, out = runs
    for r in out[world]:
        for name, p in r["step1"].items():
            assert (r["act_ckpt_step1"][name] - p).abs().max() <= 1e-6, name


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_shared_prompt_forward_matches_the_plain_one_under_fsdp(runs, world):
    from transformers import AutoModelForCausalLM

    model_dir, out = runs
    batch = make_grouped_batch(2, n=4, seed=5)
    mask = batch["response_mask"].bool()
    ref = reference_log_probs(AutoModelForCausalLM.from_pretrained(model_dir), batch, 0.7)
    for share in (True, False):
        got = torch.cat([r[f"grouped_log_probs_{share}"] for r in out[world]])
        assert (got[mask] - ref[mask]).abs().max() <= 1e-5
    for r in out[world]:
        shared, plain = r["grouped_step_True"], r["grouped_step_False"]
        # after one AdamW step at lr 1e-2: Adam divides by the gradient's own scale, so float
        # rounding in a near-zero gradient moves its weight by a small fraction of the lr
        for name, p in plain.items():
            assert (shared[name] - p).abs().max() <= 1e-4, name
        assert any((shared[k] - r["step1"][k]).abs().max() > 1e-4 for k in plain)  # a different step
    # the run finished (no deadlock) with one rank sharing prompts and the other not, and right
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    per_rank = 8 // world
    parts = [make_grouped_batch(2, n=4, seed=5), make_batch(8, seed=6)]
    for rank, r in enumerate(out[world]):
        part = {k: v[rank * per_rank : (rank + 1) * per_rank] for k, v in parts[rank].items()}
        ref, m = reference_log_probs(model, part, 0.7), part["response_mask"].bool()
        assert (r["mixed_log_probs"][m] - ref[m]).abs().max() <= 1e-5


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_rows_with_zero_gradient_are_skipped_and_the_step_is_the_same(runs, world):
    """Skipped rows (a different number per rank, and then all of them) leave both AdamW steps as
    the full batch's: the second one, with zero gradients, still moves the weights by momentum."""
    _, out = runs
    for r in out[world]:
        full, skipped = r["skip_False_step1"], r["skip_True_step1"]
        # AdamW at lr 1e-2 divides by the gradient's own scale: float rounding in a near-zero
        # gradient element (summed in another order) moves it by a small fraction of the lr
        for name, p in full.items():
            assert (skipped[name] - p).abs().max() <= 1e-4, name
        for name, p in r["skip_False_step2"].items():
            assert (r["skip_True_step2"][name] - p).abs().max() <= 1e-4, name
            assert (p - full[name]).abs().max() > 0 or name.endswith("norm.weight"), name
    assert all(r["skip_True_frac"] == 0.5 for r in out[world])  # the batch's share, on every rank
    assert all(r["skip_False_frac"] == 0.0 for r in out[world])
