"""The canary after a weight sync: the rollout engine scores a fixed token sequence and the
trainer does too; an engine that stores the new weights but computes with old ones (a test double of
a captured graph) stops the run at that step naming the engine, while healthy runs log
``sync/canary_*`` (every sync, or as a spot check where the engine computes with the very tensors
the fingerprint reads)."""

from __future__ import annotations

import copy

import pytest
import torch

from rlctl.engines.fsdp_train import FSDPTrainEngine
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.errors import RunError
from rlctl.trainer.state.canary import (
    CANARY_LENGTH,
    SyncCanary,
    canary_batch,
    canary_due,
    canary_tokens,
)
from rlctl.trainer.state.fingerprint import SyncCheck, merge_sync_metrics
from tests.cli_runner import run_cli
from tests.trainer.test_train_e2e import by_step, metrics

STALE_LAYER = 1


class CapturedGraphRollout(HFRolloutEngine):
    """A test double of an engine whose compiled graph captured layer 1's weights at load time:
    ``update_weights`` writes the new tensors into the model (its state dict and fingerprints show
    them), but layer 1's forward keeps computing with the snapshot taken when it was built."""

    computes_with_stored_weights = False  # what a compiled engine declares: canaried every sync

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        layer = self.model.model.layers[STALE_LAYER]
        snapshot = copy.deepcopy(layer)
        layer.forward = snapshot.forward  # the live module keeps its parameters; compute goes to the copy


def _moved(engine: FSDPTrainEngine) -> None:
    """An 'update': every trainer weight moves by 1e-3 relative."""
    with torch.no_grad():
        for p in engine.model.parameters():
            p.mul_(1.001)


def test_canary_sequence_is_fixed_and_scored_as_the_trainer_scores(tiny_model):
    tokens = canary_tokens(50)
    assert tokens == canary_tokens(50) and len(tokens) == CANARY_LENGTH and max(tokens) < 50
    batch = canary_batch(tokens)
    assert batch["responses"].tolist() == [tokens[1:]] and batch["response_mask"].sum() == CANARY_LENGTH - 1
    actor, rollout = FSDPTrainEngine(tiny_model), HFRolloutEngine(tiny_model)
    ours = actor.compute_log_prob(batch)["log_probs"][0]
    theirs = rollout.prompt_log_probs(tokens)
    assert theirs.shape == ours.shape and float((ours - theirs).abs().max()) < 1e-5


def test_stale_layer_passes_the_fingerprint_and_fails_the_canary_naming_the_engine(tiny_model):
    actor = FSDPTrainEngine(tiny_model)
    rollout = CapturedGraphRollout(tiny_model)
    check = SyncCheck(canary=SyncCanary(train_dtype="float32", rollout_dtype="float32"))
    first = check.after_sync(actor.model, rollout, device="cpu", actor=actor)  # load-time weights: equal
    assert first["sync/fingerprint_ok"] == 1.0 and first["sync/canary_ok"] == 1.0
    assert first["sync/canary_gap_mean"] < 1e-6 < first["sync/canary_limit"]
    _moved(actor)
    rollout.update_weights(actor.export_weights("full"))
    with pytest.raises(RunError) as err:
        check.after_sync(actor.model, rollout, device="cpu", actor=actor)
    text = str(err.value)
    for needle in ("weight sync 2", "canary", "CapturedGraphRollout", "parity tolerance"):
        assert needle in text, (needle, text)
    # the stored tensors were right: the fingerprint alone would have passed
    plain = SyncCheck().after_sync(actor.model, rollout, device="cpu")
    assert plain["sync/fingerprint_ok"] == 1.0 and "sync/canary_ok" not in plain


def test_healthy_engine_passes_after_an_update_and_metrics_merge_over_ranks(tiny_model):
    actor, rollout = FSDPTrainEngine(tiny_model), HFRolloutEngine(tiny_model)
    check = SyncCheck(canary=SyncCanary(train_dtype="float32", rollout_dtype="bfloat16"))
    _moved(actor)
    rollout_bf16 = HFRolloutEngine(tiny_model, dtype="bfloat16")
    rollout_bf16.update_weights(actor.export_weights("full"))
    threads = torch.get_num_threads()
    out = check.after_sync(actor.model, rollout_bf16, device="cpu", actor=actor)
    assert torch.get_num_threads() == threads  # the canary's one CPU thread is given back
    assert out["sync/canary_ok"] == 1.0 and 0 < out["sync/canary_gap_mean"] <= out["sync/canary_limit"]
    assert out["sync/canary_limit"] > 1e-2  # the bf16 tolerance, not fp32's
    other = dict(out, **{"sync/canary_gap_mean": 0.0, "sync/canary_s": 99.0})
    merged = merge_sync_metrics([out, other])
    assert merged["sync/canary_gap_mean"] == out["sync/canary_gap_mean"] and merged["sync/canary_s"] == 99.0
    del rollout


def test_engine_without_scoring_reports_minus_one_once(tiny_model, caplog):
    class NoScore:
        def weight_fingerprint(self, spec):
            return None

    actor = FSDPTrainEngine(tiny_model)
    canary = SyncCanary(train_dtype="float32", rollout_dtype="float32")
    out = canary.check(actor, NoScore(), 1)
    assert out["sync/canary_ok"] == -1.0 and canary.warned


@pytest.mark.timeout(300)
def test_run_with_a_captured_graph_stops_at_the_first_update_naming_the_engine(
    write_profile, tmp_path, rollout_engine_class
):
    rollout_engine_class(CapturedGraphRollout)
    profile = write_profile("stale", steps=3, entropy_coeff=0.01)
    code, _, err = run_cli("train", str(profile), "--set", "trainer.save_every=0")
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    for needle in ("step=1", "method=sync_weights", "CapturedGraphRollout", "canary"):
        assert needle in last, (needle, last)
    print(last)
    assert max(by_step(metrics(tmp_path / "runs/stale"))) == 0, "no step after the broken sync may be logged"


@pytest.mark.timeout(300)
def test_healthy_run_spot_checks_the_hf_engine_with_the_canary(write_profile, tmp_path):
    profile = write_profile("canary-ok", steps=3)
    code, _, err = run_cli("train", str(profile), "--set", "trainer.save_every=0")
    assert code == 0, err
    steps = by_step(metrics(tmp_path / "runs/canary-ok"))
    s = steps[1]  # the first update's weights (version 2)
    assert s["sync/canary_ok"] == 1.0
    assert 0 <= s["sync/canary_gap_mean"] < s["sync/canary_limit"] < 1e-3  # fp32 on both sides
    assert 0 < s["sync/canary_s"] < s["time/step"]
    for step in (2, 3):  # versions 3 and 4: the fingerprint alone (the engine computes with what it stores)
        assert steps[step]["sync/fingerprint_ok"] == 1.0 and "sync/canary_ok" not in steps[step]


def test_the_canary_runs_every_sync_unless_the_engine_computes_with_what_it_stores(tiny_model):
    class Compiled(HFRolloutEngine):
        computes_with_stored_weights = False

    assert [v for v in range(1, 32) if canary_due(v, HFRolloutEngine)] == [1, 2, 10, 20, 30]
    assert all(canary_due(v, Compiled) for v in range(1, 32))
    assert all(canary_due(v, object()) for v in range(1, 32))  # an engine that does not say
    actor, rollout = FSDPTrainEngine(tiny_model), Compiled(tiny_model)
    check = SyncCheck(canary=SyncCanary(train_dtype="float32", rollout_dtype="float32"))
    for _ in range(3):
        _moved(actor)
        rollout.update_weights(actor.export_weights("full"))
        out = check.after_sync(actor.model, rollout, device="cpu", actor=actor)
        assert out["sync/fingerprint_ok"] == 1.0 and out["sync/canary_ok"] == 1.0


@pytest.mark.timeout(300)
def test_one_step_off_rollout_worker_stops_at_the_first_stale_push_naming_the_engine(
    write_profile, tmp_path, rollout_engine_class
):
    rollout_engine_class(CapturedGraphRollout)
    profile = write_profile("stale-off", steps=3, extra='mode = "one_step_off"\n', entropy_coeff=0.01)
    # no validation: the colocated engine (synced only before one) stays out of it
    code, _, err = run_cli(
        "train", str(profile), "--set", "trainer.save_every=0", "--set", "trainer.val_every=0"
    )
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    # weight version 2 (step 1's update) is pushed for batch 3: batches 1 and 2 used version 1
    for needle in (
        "step=3",
        "role=rollout",
        "method=update_weights",
        "weight version 2",
        "canary",
        "CapturedGraphRollout (rollout worker)",
        "parity tolerance",
    ):
        assert needle in last, (needle, last)
    steps = by_step(metrics(tmp_path / "runs/stale-off"))
    assert max(steps) == 2, "no step trained on the broken push's batch may be logged"
    assert all(steps[s]["sync/canary_ok"] == 1.0 for s in (1, 2))  # version 1: the load-time weights


@pytest.mark.timeout(300)
def test_healthy_one_step_off_run_logs_the_rollout_workers_canary_every_step(write_profile, tmp_path):
    profile = write_profile("canary-off", steps=3, extra='mode = "one_step_off"\n')
    code, _, err = run_cli("train", str(profile), "--set", "trainer.save_every=0")
    assert code == 0, err
    steps = by_step(metrics(tmp_path / "runs/canary-off"))
    for step in (1, 2, 3):
        s = steps[step]
        assert s["async/weight_version_min"] == max(step - 1, 1)  # the pushes of versions 1 and 2
        assert s["sync/canary_ok"] == 1.0 and s["sync/fingerprint_ok"] == 1.0
        assert 0 <= s["sync/canary_gap_mean"] < s["sync/canary_limit"] < 1e-3  # fp32 on both sides
        assert 0 < s["sync/canary_s"] < s["time/step"]


def test_the_limit_grows_with_the_logit_spread_of_a_trained_model():
    """bfloat16 on both sides (an H200's built-in run drifted to a 0.2-nat gap by step 46): the
    limit is the parity tolerance while the canary sits where a flat distribution puts it, and
    scales with how far below that the trained model puts the canary's random tokens."""
    import math

    from rlctl.errors import RunError
    from rlctl.trainer.state.canary import SyncCanary, logit_spread

    canary = SyncCanary(train_dtype="bfloat16", rollout_dtype="bfloat16")
    vocab, tokens = 104, list(range(32))
    flat = torch.full((31,), -math.log(vocab), dtype=torch.float64)
    base = canary.compare(flat, flat, tokens, (4, 128), 1, "E", vocab_size=vocab)["sync/canary_limit"]
    assert logit_spread(flat, vocab) == pytest.approx(1.0) and logit_spread(flat * 3, 0) == 1.0
    sharp = flat * 3  # random tokens three times further below the top
    out = canary.compare(sharp + 2 * base, sharp, tokens, (4, 128), 1, "E", vocab_size=vocab)
    assert out["sync/canary_limit"] == pytest.approx(3 * base) and out["sync/canary_ok"] == 1.0
    with pytest.raises(RunError, match="logit spread"):
        canary.compare(sharp + 4 * base, sharp, tokens, (4, 128), 1, "E", vocab_size=vocab)
    with pytest.raises(RunError, match="canary"):  # unscaled without the vocabulary
        canary.compare(sharp + 2 * base, sharp, tokens, (4, 128), 1, "E")


class AiterShuffledMoeRollout(HFRolloutEngine):
    """A test double of vLLM's AITER fused MoE on ROCm (vllm 0.33.0
    ``fused_moe/oracle/unquantized.py``: ``rocm_aiter_ops.shuffle_weights`` of the experts in
    ``process_weights_after_loading``): at load the experts' tensors are rearranged into the
    kernel's layout and the kernel reads that layout. rlctl's sync then writes checkpoint-layout
    tensors in place; what is stored equals the trainer's, what is computed is not."""

    computes_with_stored_weights = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for layer in self.model.model.layers:
            experts = layer.mlp.experts
            rows = experts.gate_up_proj.shape[1]
            order = torch.roll(torch.arange(rows), 1)  # the kernel's block order (a fixed permutation)
            back = torch.argsort(order)
            with torch.no_grad():  # post-load processing: the stored tensor takes the kernel's layout
                experts.gate_up_proj.data = experts.gate_up_proj.data[:, order].contiguous()
            forward = experts.forward

            def kernel(*a, _experts=experts, _forward=forward, _back=back, **kw):
                stored = _experts.gate_up_proj.data
                _experts.gate_up_proj.data = stored[:, _back]  # the kernel reads the shuffled layout
                try:
                    return _forward(*a, **kw)
                finally:
                    _experts.gate_up_proj.data = stored

            experts.forward = kernel

    def weight_fingerprint(self, spec, salt=0):
        """As vLLM's worker answers for a layout rlctl does not know (``weight_layouts``): None."""
        out = super().weight_fingerprint(spec, salt)
        return {name: (None if ".experts." in name else value) for name, value in out.items()}


@pytest.fixture
def tiny_moe(tmp_path):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen2MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    Qwen2MoeForCausalLM(config).save_pretrained(tmp_path / "moe")
    return str(tmp_path / "moe")


def test_the_canary_catches_experts_left_in_the_wrong_layout_after_a_sync(tiny_moe):
    """Loaded through the engine's own post-load processing the experts compute right; after an
    in-place sync of checkpoint-layout tensors (what rlctl does, hence VLLM_ROCM_USE_AITER_MOE=0 on
    ROCm) the stored tensors pass the fingerprint and the canary stops the run."""
    actor = FSDPTrainEngine(tiny_moe)
    rollout = AiterShuffledMoeRollout(tiny_moe)
    check = SyncCheck(canary=SyncCanary(train_dtype="float32", rollout_dtype="float32"))
    first = check.after_sync(actor.model, rollout, device="cpu", actor=actor)
    assert first["sync/canary_ok"] == 1.0  # the engine's own load: right values in its layout
    _moved(actor)
    rollout.update_weights(actor.export_weights("full"))
    with pytest.raises(RunError, match="canary.*AiterShuffledMoeRollout|AiterShuffledMoeRollout.*canary"):
        check.after_sync(actor.model, rollout, device="cpu", actor=actor)
    # the fingerprint alone cannot tell: the experts are "not available" (-1), the rest matches
    assert SyncCheck().after_sync(actor.model, rollout, device="cpu")["sync/fingerprint_ok"] == -1.0


class OneUpdateStaleRollout(HFRolloutEngine):
    """A test double of an engine one update stale: each ``update_weights`` stores the new tensors
    (its fingerprint shows them) but every module keeps computing with the weights of the sync
    before (a snapshot taken before the update)."""

    computes_with_stored_weights = False

    def update_weights(self, weights):
        snapshot = copy.deepcopy(self.model)
        count = super().update_weights(weights)
        old = dict(snapshot.named_modules())
        for name, module in self.model.named_modules():
            if any(True for _ in module.parameters(recurse=False)):
                module.forward = old[name].forward
        return count


def test_frozen_scores_after_an_update_fail_the_differential_check_within_the_bf16_limit():
    """bf16's limit (about 0.5 nats per token on a 7B model) lets a copy one update stale (0.24)
    pass the absolute check; the differential one names the engine at the first sync after it."""
    from rlctl.trainer.state.canary import frozen

    g = torch.Generator().manual_seed(1)
    tokens = canary_tokens(151_936)
    n = len(tokens) - 1
    shape = (28, 3584)  # Qwen2-7B's layers and hidden size
    v1 = -8 + torch.randn(n, generator=g)
    v2 = v1 + 0.24 * torch.randn(n, generator=g).sign()  # one update: 0.24 nats per token
    theirs_v1 = v1 + 0.05 * torch.randn(n, generator=g)
    assert frozen(theirs_v1, theirs_v1, v2, v1) and not frozen(theirs_v1, theirs_v1, v1, v1)
    canary = SyncCanary(train_dtype="bfloat16", rollout_dtype="bfloat16")
    out = canary.compare(theirs_v1, v1, tokens, shape, 1, "VLLMRolloutEngine", vocab_size=151_936)
    assert "sync/canary_rollout_moved" not in out  # nothing to compare with yet
    healthy = copy.deepcopy(canary)
    theirs_v2 = v2 + 0.05 * torch.randn(n, generator=g)
    ok = healthy.compare(theirs_v2, v2, tokens, shape, 2, "VLLMRolloutEngine", vocab_size=151_936)
    assert ok["sync/canary_rollout_moved"] > 0.1 and ok["sync/canary_trainer_moved"] == pytest.approx(0.24)
    assert ok["sync/canary_limit"] > 0.24  # the absolute limit alone passes the stale copy below
    with pytest.raises(RunError, match=r"VLLMRolloutEngine .*exactly as it did with the previous weights"):
        canary.compare(theirs_v1, v2, tokens, shape, 2, "VLLMRolloutEngine", vocab_size=151_936)


@pytest.mark.timeout(300)
def test_bf16_run_with_a_rollout_copy_one_update_stale_stops_at_its_first_sync_naming_the_engine(
    write_profile, tmp_path, rollout_engine_class
):
    rollout_engine_class(OneUpdateStaleRollout)
    profile = write_profile("stale1", steps=3, entropy_coeff=0.01)  # the weights move every step
    code, _, err = run_cli(
        "train", str(profile), "--set", "trainer.save_every=0", "--set", "platform.dtype=bfloat16"
    )
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    for needle in ("step=1", "method=sync_weights", "OneUpdateStaleRollout", "previous weights"):
        assert needle in last, (needle, last)
    assert max(by_step(metrics(tmp_path / "runs/stale1"))) == 0

