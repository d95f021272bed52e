"""LoRA through peft on FSDP2 (gloo, 1 and 2 ranks) against peft's own single-process model:
the gradient, the adapter-only sync into the HF rollout engine, the reference (adapter off),
checkpoints across world sizes and the HF export (adapter directory + merged model)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.engines.helpers import (
    make_batch,
    make_model,
    reference_log_probs,
    spawn_per_world_size,
    token_mean_loss,
)

WORLD_SIZES = (1, 2)
SPEC_KW = dict(rank=4, alpha=8.0, target_modules=("all-linear",), seed=7)


def start_adapter(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Non-zero A and B (a fresh adapter's B is zero, so A would get no gradient)."""
    import zlib

    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randn(shape, generator=g) * 0.3


def _set_rows(param: torch.Tensor, full: torch.Tensor) -> None:
    from rlctl.engines.fsdp_load import dim0_range

    start, stop = dim0_range(param)
    local = param.to_local() if hasattr(param, "to_local") else param
    with torch.no_grad():
        local.copy_(full[start:stop])


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _worker(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist

    from rlctl.engines.fsdp_train import FSDPTrainEngine
    from rlctl.engines.hf_rollout import HFRolloutEngine
    from rlctl.engines.lora import LoraSpec
    from rlctl.engines.optim import OptimConfig
    from rlctl.errors import RunError
    from rlctl.trainer.state.fingerprint import SyncCheck

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        spec = LoraSpec(**SPEC_KW, export_merged=True)
        optim = OptimConfig(lr=1e-2, grad_clip=0.0, warmup_steps=0, total_steps=4)
        rows = slice(rank * (8 // world), (rank + 1) * (8 // world))
        b1 = {k: v[rows] for k, v in make_batch(8, seed=1).items()}
        b2 = {k: v[rows] for k, v in make_batch(8, seed=2).items()}
        engine = FSDPTrainEngine(model_dir, micro_batch_size=2, optim=optim, lora=spec)
        result: dict = {"initial": {n: _full(p) for n, p in engine.model.named_parameters() if ".lora_" in n}}
        for name, p in engine.model.named_parameters():
            if ".lora_" in name:
                _set_rows(p, start_adapter(name, tuple(p.shape)))
        result["trainable"] = sorted(n for n, p in engine.model.named_parameters() if p.requires_grad)
        result["optimised"] = sum(len(g["params"]) for g in engine.optimizer.param_groups)
        result["base_log_probs"] = engine.compute_base_log_prob(b1)["log_probs"]
        result["metrics"] = engine.train_batch(b1, token_mean_loss)
        result["grads"] = {n: _full(p.grad) for n, p in engine.model.named_parameters() if p.requires_grad}
        result["adam_states"] = len(engine.optimizer.state)
        result["step1"] = {n: _full(t) for n, t in engine.export_adapter()}
        result["lora_metrics"] = engine.lora_metrics()
        result["base_after_step"] = engine.compute_base_log_prob(b1)["log_probs"]
        result["policy_after_step"] = engine.compute_log_prob(b1)["log_probs"]

        # adapter-only sync into an HF rollout engine that holds the base once
        rollout = HFRolloutEngine(model_dir, lora=spec)
        result["synced"] = rollout.update_weights(engine.export_adapter())
        check = SyncCheck(rank=rank)
        result["fingerprint"] = check.after_sync(engine.model, rollout, device=engine.device)
        ids, mask = make_batch(8, seed=3)["input_ids"], make_batch(8, seed=3)["attention_mask"]
        with torch.no_grad():
            result["rollout_logits"] = rollout.model(input_ids=ids, attention_mask=mask).logits
        with torch.no_grad():  # a rollout copy that missed the update fails the check
            rollout.model.get_parameter(result["trainable"][0]).add_(1.0)
        try:
            check.after_sync(engine.model, rollout, device=engine.device)
            result["stale_error"] = None
        except RunError as exc:
            result["stale_error"] = str(exc)

        engine.save_checkpoint(os.path.join(out_dir, "ckpt"))
        engine.train_batch(b2, token_mean_loss)
        result["step2"] = {n: _full(t) for n, t in engine.export_adapter()}
        engine.save_hf(os.path.join(out_dir, "hf"))
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("lora")
    model_dir = make_model(base / "model", tie=True, seed=3)
    return model_dir, spawn_per_world_size(_worker, base, model_dir, WORLD_SIZES)


def _peft_model(model_dir, adapter: dict[str, torch.Tensor]):
    """peft's own model (``get_peft_model``) holding ``adapter`` (rlctl's names, prefixed as peft's)."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from rlctl.engines.lora import LoraSpec

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), LoraSpec(**SPEC_KW).peft_config())
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in adapter.items():
            params[f"base_model.model.{name}"].copy_(value)
    return model


@pytest.fixture(scope="module")
def peft_grads(runs):
    """peft's gradient of the same token-mean loss over the whole batch, one process."""
    model_dir, out = runs
    start = {n: start_adapter(n, tuple(t.shape)) for n, t in out[1][0]["step1"].items()}
    model = _peft_model(model_dir, start)
    batch = make_batch(8, seed=1)
    mask = batch["response_mask"].float()
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits[:, -mask.shape[1] - 1 : -1]
    log_probs = torch.log_softmax(logits.float(), -1).gather(-1, batch["responses"][..., None]).squeeze(-1)
    loss = -(log_probs * mask).sum() / mask.sum()
    loss.backward()
    return {n.removeprefix("base_model.model."): p.grad for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_lora_gradient_equals_peft(runs, peft_grads, world):
    _, out = runs
    for r in out[world]:
        assert sorted(peft_grads) == r["trainable"]  # only the adapter trains
        assert r["optimised"] == len(peft_grads) and r["adam_states"] == len(peft_grads)
        for name, ref in peft_grads.items():
            got = r["grads"][name]
            assert ref.abs().max() > 0, name
            assert (got - ref).norm() <= 1e-5 * ref.norm(), name


@pytest.mark.timeout(300)
def test_adapter_starts_the_same_at_every_world_size(runs):
    _, out = runs
    first = out[1][0]["initial"]
    assert any(v.abs().max() > 0 for v in first.values())
    for name, value in first.items():
        assert torch.equal(out[2][0]["initial"][name], value), name
        assert (value == 0).all() == (".lora_B." in name), name


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_reference_is_the_base_model(runs, world):
    from transformers import AutoModelForCausalLM

    model_dir, out = runs
    base = reference_log_probs(AutoModelForCausalLM.from_pretrained(model_dir), make_batch(8, seed=1))
    mask = make_batch(8, seed=1)["response_mask"].bool()
    got = torch.cat([r["base_after_step"] for r in out[world]])
    policy = torch.cat([r["policy_after_step"] for r in out[world]])
    assert torch.allclose(got[mask], base[mask], atol=1e-5, rtol=0)
    assert (policy[mask] - base[mask]).abs().max() > 1e-3  # the adapter is on again afterwards


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_sync_sends_the_adapter_and_rollout_logits_equal_merged_model(runs, world):
    model_dir, out = runs
    r0 = out[world][0]
    merged = _peft_model(model_dir, r0["step1"]).merge_and_unload()
    batch = make_batch(8, seed=3)
    with torch.no_grad():
        ref = merged(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    for r in out[world]:
        assert r["synced"] == len(r["trainable"])
        assert r["fingerprint"]["sync/fingerprint_ok"] == 1.0
        diff = (r["rollout_logits"] - ref).abs().max()
        assert diff <= 1e-5 * ref.abs().max(), float(diff)  # fp32: W x + B(A x) vs (W + BA) x
        assert "differs from the trainer's" in r["stale_error"]
    assert r0["lora_metrics"]["lora/trainable_params"] == sum(t.numel() for t in r0["step1"].values())
    norm = torch.sqrt(sum(t.double().pow(2).sum() for t in r0["step1"].values()))
    assert abs(r0["lora_metrics"]["lora/adapter_norm"] - float(norm)) <= 1e-6 * float(norm)


@pytest.mark.timeout(300)
def test_checkpoint_holds_the_adapter_and_resumes_on_another_world_size(runs, tmp_path):
    import torch.distributed.checkpoint as dcp

    from rlctl.engines.fsdp_train import FSDPTrainEngine
    from rlctl.engines.lora import LoraSpec
    from rlctl.engines.optim import OptimConfig

    model_dir, out = runs
    ckpt = out[2][0]["dir"] / "ckpt"
    keys = list(dcp.FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata)
    assert keys and [k for k in keys if ".lora_" not in k and not k.startswith("optim.param_groups")] == []
    optim = OptimConfig(lr=1e-2, grad_clip=0.0, warmup_steps=0, total_steps=4)
    engine = FSDPTrainEngine(model_dir, micro_batch_size=8, optim=optim, lora=LoraSpec(**SPEC_KW))
    engine.load_checkpoint(ckpt)  # written by 2 ranks, read by one process
    assert engine.global_step == 1
    engine.train_batch(make_batch(8, seed=2), token_mean_loss)
    for name, value in dict(engine.export_adapter()).items():
        assert torch.allclose(value, out[2][0]["step2"][name], atol=1e-6, rtol=0), name


@pytest.mark.timeout(300)
def test_export_loads_with_peft_and_merged_with_transformers(runs):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlctl.engines.hf_rollout import HFRolloutEngine

    model_dir, out = runs
    hf = out[2][0]["dir"] / "hf"
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), str(hf))
    merged = AutoModelForCausalLM.from_pretrained(str(hf / "merged"))
    expect = _peft_model(model_dir, out[2][0]["step2"])
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    batch = make_batch(8, seed=4)
    with torch.no_grad():
        logits = [m(input_ids=batch["input_ids"]).logits for m in (adapted, merged, expect, base)]
    scale = logits[2].abs().max()
    assert (logits[0] - logits[2]).abs().max() <= 1e-5 * scale
    assert (logits[1] - logits[2]).abs().max() <= 1e-5 * scale
    assert (logits[2] - logits[3]).abs().max() > 1e-3  # the exported adapter is the trained one
    # greedy decoding as validation does it (the HF rollout engine, greedy=True): the same tokens
    prompts = batch["input_ids"][:, :6], batch["attention_mask"][:, :6]
    decoded = [
        HFRolloutEngine(m).generate(*prompts, max_new_tokens=6, greedy=True, eos_token_id=None)["responses"]
        for m in (adapted, merged)
    ]
    assert torch.equal(decoded[0], decoded[1])
