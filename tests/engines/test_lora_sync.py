"""The two ways a LoRA actor's weights reach a rollout engine, one process: the adapter alone into
an engine that holds base + adapter (HF), and merged weights into one that holds a plain model (the
path of engines whose adapter API rlctl does not use); both sample from the same policy."""

from __future__ import annotations

import pytest
import torch

from tests.engines.helpers import make_batch, make_model


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from rlctl.engines.fsdp_train import FSDPTrainEngine
    from rlctl.engines.lora import LoraSpec

    model_dir = make_model(tmp_path_factory.mktemp("lora_sync") / "m", tie=True, seed=2)
    spec = LoraSpec(rank=4, alpha=8.0, seed=3)
    engine = FSDPTrainEngine(model_dir, lora=spec)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a trained-looking adapter: B no longer zero
        for name, p in engine.model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model_dir, spec, engine


def _logits(rollout, batch) -> torch.Tensor:
    with torch.no_grad():
        return rollout.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def test_merged_sync_equals_adapter_sync(trained):
    from rlctl.engines.hf_rollout import HFRolloutEngine
    from rlctl.trainer.state.fingerprint import SyncCheck
    from rlctl.trainer.workers.weight_streams import ByteCount, merged_stream, model_bytes

    model_dir, spec, engine = trained
    adapter_side = HFRolloutEngine(model_dir, lora=spec)
    adapter_bytes = ByteCount()
    adapter_side.update_weights(adapter_bytes(engine.export_adapter()))
    plain = HFRolloutEngine(model_dir)  # no adapter layers: what an engine without an adapter API holds
    checked: dict = {}
    merged_bytes = ByteCount()
    check = SyncCheck()
    salt = check.next_salt(plain)
    assert salt == 1
    count = plain.update_weights(merged_bytes(merged_stream(engine, spec, checked, salt)))
    assert count == len(dict(plain.model.named_parameters()))  # every base tensor, under HF names
    assert merged_bytes.bytes == model_bytes(engine.model)
    assert adapter_bytes.bytes < 0.2 * merged_bytes.bytes
    batch = make_batch(8, seed=9)
    merged, adapted = _logits(plain, batch), _logits(adapter_side, batch)
    assert (merged - adapted).abs().max() <= 1e-5 * adapted.abs().max()
    base = _logits(HFRolloutEngine(model_dir), batch)  # before any sync: the base model
    base_engine = HFRolloutEngine(model_dir)
    assert (base - merged).abs().max() > 1e-3

    # the sync check fingerprints samples of every merged tensor sent against the engine's
    assert len(checked) == count and all(".base_layer" not in n for n in checked)
    assert check.after_sync(engine.model, plain, device="cpu", params=list(checked.items()))[
        "sync/fingerprint_ok"
    ] == 1.0
    from rlctl.errors import RunError

    checked = {}
    for _ in merged_stream(engine, spec, checked, check.next_salt(base_engine)):
        pass
    with pytest.raises(RunError, match="differs from the trainer's"):  # a base-only copy is caught
        check.after_sync(engine.model, base_engine, device="cpu", params=list(checked.items()))


@pytest.mark.parametrize("never", ["model.layers.1.mlp.down_proj.weight", "model.norm.weight"])
def test_merged_sync_missing_one_tensor_fails_the_check(trained, never):
    """Any one tensor of the merged stream left out (an adapted projection, or a tensor the adapter
    does not touch after an earlier sync moved it) fails the check; a check of three tensors passed."""
    from rlctl.engines.hf_rollout import HFRolloutEngine
    from rlctl.errors import RunError
    from rlctl.trainer.state.fingerprint import SyncCheck, without
    from rlctl.trainer.workers.weight_streams import merged_stream

    model_dir, spec, engine = trained
    plain = HFRolloutEngine(model_dir)
    with torch.no_grad():  # the copy holds something else there (as a stale tensor would)
        plain.model.get_parameter(never).mul_(1.5)
    check, checked = SyncCheck(), {}
    plain.update_weights(without(merged_stream(engine, spec, checked, check.next_salt(plain)), never))
    with pytest.raises(RunError, match=never.replace(".", r"\.")):
        check.after_sync(engine.model, plain, device="cpu", params=list(checked.items()))


def test_target_modules_that_match_nothing_are_refused(trained):
    from rlctl.engines.fsdp_train import FSDPTrainEngine
    from rlctl.engines.lora import LoraSpec

    model_dir, _, _ = trained
    from rlctl.errors import UserError

    with pytest.raises(UserError, match=r"actor.lora.target_modules = \['q_projj'\]"):
        FSDPTrainEngine(model_dir, lora=LoraSpec(target_modules=("q_projj",)))


def test_colocated_rollout_shares_the_frozen_base(trained):
    from rlctl.engines import lora
    from rlctl.engines.fsdp_load import build_meta_model
    from rlctl.engines.hf_rollout import HFRolloutEngine

    model_dir, spec, engine = trained
    meta = build_meta_model(
        model_dir, dtype="float32", trust_remote_code=False, attn_implementation="sdpa", value_head=False
    )
    assert lora.can_share_base(engine.model, torch.float32) and not lora.can_share_base(engine.model, torch.bfloat16)
    shared = HFRolloutEngine(lora.shared_base_model(engine.model, lora.inject(meta, spec, on_meta=True)))
    own = dict(engine.model.named_parameters())
    for name, p in shared.model.named_parameters():
        same_storage = p.data_ptr() == own[name].data_ptr()
        assert same_storage == (not own[name].requires_grad), name  # base shared, adapter copied
        assert not p.requires_grad
    assert own["model.embed_tokens.weight"].requires_grad is False  # the trainer's flags untouched
    assert shared.model.lm_head.weight is shared.model.model.embed_tokens.weight  # still tied
    separate = HFRolloutEngine(model_dir, lora=spec)
    for rollout in (shared, separate):
        rollout.update_weights(engine.export_adapter())
    batch = make_batch(8, seed=11)
    assert torch.equal(_logits(shared, batch), _logits(separate, batch))


def test_modules_to_save_train_in_full_and_travel_with_the_adapter(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlctl.engines.fsdp_train import FSDPTrainEngine
    from rlctl.engines.hf_rollout import HFRolloutEngine
    from rlctl.engines.lora import LoraSpec
    from rlctl.engines.optim import OptimConfig
    from tests.engines.helpers import token_mean_loss

    model_dir = make_model(tmp_path / "m", tie=False, seed=4)
    spec = LoraSpec(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj"), modules_to_save=("lm_head",))
    engine = FSDPTrainEngine(model_dir, lora=spec, optim=OptimConfig(lr=1e-2, grad_clip=0.0))
    trained = {n for n, p in engine.model.named_parameters() if p.requires_grad}
    assert "lm_head.modules_to_save.default.weight" in trained
    assert all(".lora_" in n or "modules_to_save" in n for n in trained)
    assert {n.split(".")[-4] for n in trained if ".lora_" in n} == {"q_proj", "v_proj"}
    engine.train_batch(make_batch(8, seed=1), token_mean_loss)
    rollout = HFRolloutEngine(model_dir, lora=spec)
    assert rollout.update_weights(engine.export_adapter()) == len(trained)
    engine.save_hf(tmp_path / "hf")
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), str(tmp_path / "hf"))
    batch = make_batch(8, seed=12)
    with torch.no_grad():
        ours = engine.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        theirs = reloaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert (ours - theirs).abs().max() <= 1e-5 * ours.abs().max()
    assert (ours - _logits(rollout, batch)).abs().max() <= 1e-5 * ours.abs().max()
