"""FSDPTrainEngine without torch.distributed: micro-batching, values, schedule, export, errors, on every
test device (batches arrive on the host, results come back on the host)."""

from __future__ import annotations

import pytest
import torch

from rlctl.engines.fsdp_train import FSDPTrainEngine, split_batch
from rlctl.engines.optim import OptimConfig, lr_lambda
from rlctl.errors import UserError
from tests.engines.helpers import (
    log_prob_atol,
    make_batch,
    make_model,
    reference_log_probs,
    seq_mean_loss,
    seq_mean_token_sum_loss,
    seq_mean_token_sum_norm_loss,
    token_mean_loss,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("m") / "model", tie=False, seed=5)


def _grads(engine) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in engine.model.parameters() if p.grad is not None]).cpu()


def _on_host(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" for t in tensors)


@pytest.mark.parametrize(
    "loss_fn",
    [token_mean_loss, seq_mean_loss, seq_mean_token_sum_loss, seq_mean_token_sum_norm_loss],
    ids=["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"],
)
def test_gradients_do_not_depend_on_micro_batch_size(model_dir, device, loss_fn):
    batch = make_batch(8, prompt_len=7, resp_len=6, seed=11)
    grads, norms = {}, {}
    rtol = 1e-6 if device == "cpu" else 1e-5  # accelerator kernels change reduction order with shape
    for mbs in (1, 2, 4, 3):
        engine = FSDPTrainEngine(
            model_dir, device=device, micro_batch_size=mbs, optim=OptimConfig(lr=0.0, grad_clip=0.0)
        )
        norms[mbs] = engine.train_batch(batch, loss_fn)["grad_norm"]
        grads[mbs] = _grads(engine)
    ref = grads[1]
    assert ref.norm() > 0
    for mbs, g in grads.items():
        assert (g - ref).norm() / ref.norm() <= rtol, mbs
        assert abs(norms[mbs] - norms[1]) <= rtol * norms[1]


def test_loss_scale_totals_cover_the_whole_mini_batch(model_dir):
    batch = make_batch(6, seed=2)
    seen = []

    def loss_fn(outputs, mb, scale):
        seen.append((scale, mb["responses"].shape[0]))
        return (outputs["log_probs"] * 0).sum(), {"rows": float(mb["responses"].shape[0])}

    engine = FSDPTrainEngine(model_dir, micro_batch_size=4)
    metrics = engine.train_batch(batch, loss_fn)
    assert [rows for _, rows in seen] == [4, 2]
    assert {s for s, _ in seen} == {seen[0][0]}
    assert seen[0][0].global_tokens == int(batch["response_mask"].sum())
    assert seen[0][0].global_seqs == 6 and seen[0][0].dp_size == 1
    assert metrics["rows"] == 3.0  # averaged over micro-batches
    assert metrics["grad_norm"] == 0.0


def test_log_probs_and_entropy_match_a_plain_forward(model_dir, device):
    from transformers import AutoModelForCausalLM

    batch = make_batch(5, seed=4)
    engine = FSDPTrainEngine(model_dir, device=device, micro_batch_size=2)
    out = engine.compute_log_prob(batch, temperature=0.7, with_entropy=True)
    assert _on_host(*out.values())
    atol = log_prob_atol(device)
    assert torch.allclose(
        engine.compute_log_prob(batch, 0.7, micro_batch_size=5)["log_probs"], out["log_probs"], atol=atol / 10
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir)  # the CPU reference
    ref = reference_log_probs(model, batch, 0.7)
    mask = batch["response_mask"].bool()
    assert torch.allclose(out["log_probs"][mask], ref[mask], atol=atol, rtol=0)
    with torch.no_grad():
        logits = model(**{k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}).logits
    p = torch.softmax(logits[:, -6:-1] / 0.7, -1)
    ent = -(p * p.clamp_min(1e-30).log()).sum(-1)
    assert torch.allclose(out["entropy"][mask], ent[mask], atol=atol, rtol=0)
    # a different temperature changes the numbers (temperature is really applied)
    assert not torch.allclose(engine.compute_log_prob(batch)["log_probs"][mask], ref[mask], atol=1e-3)


def test_activation_checkpointing_gives_the_same_gradients(model_dir, device):
    batch = make_batch(4, seed=6)
    out = []
    for ckpt in (False, True):
        engine = FSDPTrainEngine(model_dir, device=device, micro_batch_size=2, activation_checkpointing=ckpt)
        assert engine.model.is_gradient_checkpointing == ckpt
        engine.train_batch(batch, token_mean_loss)
        out.append(_grads(engine))
    assert (out[0] - out[1]).norm() / out[0].norm() <= (1e-6 if device == "cpu" else 1e-5)


def test_critic_values_train_and_export(model_dir, device, tmp_path):
    from rlctl.engines.hf_model import load_value_model

    batch = make_batch(4, seed=7)
    target = torch.linspace(-1, 1, batch["responses"].shape[1]).expand_as(batch["response_mask"])

    def value_loss(outputs, mb, scale):
        mask = mb["response_mask"].float()
        err = (outputs["values"] - target[: mask.shape[0]].to(mask.device)) ** 2
        loss = (err * mask).sum() / scale.global_tokens * scale.dp_size
        return loss, {"vf_loss": float(loss.detach())}

    critic = FSDPTrainEngine(
        model_dir, device=device, value_head=True, micro_batch_size=4, optim=OptimConfig(lr=3e-3)
    )
    before = critic.compute_values(batch)
    assert before.shape == batch["response_mask"].shape and _on_host(before)
    losses = [critic.train_batch(batch, value_loss)["vf_loss"] for _ in range(5)]
    assert losses[-1] < losses[0]
    critic.save_hf(tmp_path / "critic")
    reloaded = load_value_model(tmp_path / "critic")
    with torch.no_grad():
        values = reloaded(batch["input_ids"], batch["attention_mask"], batch["position_ids"])[:, -6:-1]
    mask = batch["response_mask"].bool()  # positions without a response token carry no value
    assert torch.allclose(values[mask], critic.compute_values(batch)[mask], atol=1e-6 if device == "cpu" else 1e-4)
    with pytest.raises(UserError, match="value_head"):
        critic.compute_log_prob(batch)


def test_full_export_streams_hf_names_and_save_hf_copies_tokenizer_files(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    (model_dir / "tokenizer_config.json").write_text("{}")
    engine = FSDPTrainEngine(model_dir)
    names = [n for n, _ in engine.export_weights("full", dtype=torch.bfloat16)]
    hf = AutoModelForCausalLM.from_pretrained(model_dir)
    assert names == [n for n, _ in hf.named_parameters()]
    assert all(t.dtype == torch.bfloat16 for _, t in engine.export_weights("full", dtype=torch.bfloat16))
    engine.save_hf(tmp_path / "out")
    assert (tmp_path / "out" / "tokenizer_config.json").is_file()
    with pytest.raises(UserError, match="mode"):
        list(engine.export_weights("bogus"))


def test_lr_schedule_warmup_then_cosine():
    f = lr_lambda(OptimConfig(lr=1.0, warmup_steps=2, total_steps=6, schedule="cosine", min_lr_ratio=0.1))
    assert [round(f(s), 4) for s in range(7)] == [0.0, 0.5, 1.0, 0.8682, 0.55, 0.2318, 0.1]
    const = lr_lambda(OptimConfig(warmup_steps=0))
    assert const(0) == const(100) == 1.0
    with pytest.raises(ValueError):
        OptimConfig(schedule="linear")


def test_engine_lr_follows_schedule(model_dir):
    engine = FSDPTrainEngine(
        model_dir, optim=OptimConfig(lr=0.1, warmup_steps=2, total_steps=4, schedule="cosine")
    )
    lrs = [engine.train_batch(make_batch(2), token_mean_loss)["lr"] for _ in range(3)]
    assert lrs == pytest.approx([0.0, 0.05, 0.1])  # verl's warmup: step / warmup_steps
    assert engine.global_step == 3


def test_bad_inputs_are_user_errors(model_dir, tmp_path):
    with pytest.raises(UserError, match="config.json"):
        FSDPTrainEngine(tmp_path / "missing")
    with pytest.raises(UserError, match="dtype"):
        FSDPTrainEngine(model_dir, dtype="float8")
    with pytest.raises(UserError, match="micro_batch_size"):
        FSDPTrainEngine(model_dir, micro_batch_size=0)
    with pytest.raises(UserError, match="value_head"):
        FSDPTrainEngine(model_dir).compute_values(make_batch(2))


def test_split_batch_covers_every_row_once():
    batch = {"a": torch.arange(7), "b": torch.arange(7) * 2}
    parts = split_batch(batch, 3)
    assert [len(p["a"]) for p in parts] == [3, 3, 1]
    assert torch.equal(torch.cat([p["b"] for p in parts]), batch["b"])


def test_offload_onload_round_trip(model_dir, device):
    """On CPU both are no-ops; on an accelerator the weights visit the host and come back unchanged."""
    engine = FSDPTrainEngine(model_dir, device=device, optim=OptimConfig(lr=0.1))
    engine.train_batch(make_batch(2), token_mean_loss)  # optimizer state exists and must travel too
    before = {k: v.clone() for k, v in engine.export_weights()}
    engine.offload()
    assert {p.device.type for p in engine.model.parameters()} == {"cpu"}
    engine.onload()
    assert {p.device.type for p in engine.model.parameters()} == {device}
    assert all(torch.equal(before[k], v) for k, v in engine.export_weights())
    engine.train_batch(make_batch(2), token_mean_loss)  # and training goes on where it was


def test_non_finite_gradients_skip_the_update(model_dir, device):
    engine = FSDPTrainEngine(model_dir, device=device, optim=OptimConfig(lr=0.1))
    before = {k: v.clone() for k, v in engine.export_weights()}

    def nan_loss(outputs, mb, scale):
        return outputs["log_probs"].sum() * float("nan"), {}

    metrics = engine.train_batch(make_batch(2), nan_loss)
    assert metrics["skipped"] == 1.0 and engine.global_step == 0
    assert all(torch.equal(before[k], v) for k, v in engine.export_weights())
    assert engine.train_batch(make_batch(2), token_mean_loss)["skipped"] == 0.0 and engine.global_step == 1


def test_token_budget_cuts_micro_batches_by_padded_width(model_dir):
    batch = make_batch(8, prompt_len=7, resp_len=6, seed=11)  # width 13
    engine = FSDPTrainEngine(model_dir, micro_batch_size=2, micro_batch_tokens=40)
    assert engine.rows_per_micro_batch(batch) == 3  # 40 // 13
    assert [len(mb["input_ids"]) for mb in engine._split(batch, "test")] == [3, 3, 2]
    assert FSDPTrainEngine(model_dir, micro_batch_tokens=5).rows_per_micro_batch(batch) == 1
    assert FSDPTrainEngine(model_dir, micro_batch_size=2).rows_per_micro_batch(batch) == 2
    grads = {}
    for kw in ({"micro_batch_size": 1}, {"micro_batch_tokens": 1000}):
        e = FSDPTrainEngine(model_dir, optim=OptimConfig(lr=0.0, grad_clip=0.0), **kw)
        e.train_batch(batch, token_mean_loss)
        grads[next(iter(kw))] = _grads(e)
    a, b = grads.values()
    assert (a - b).norm() / a.norm() <= 1e-6
    with pytest.raises(UserError, match="micro_batch_tokens=-1"):
        FSDPTrainEngine(model_dir, micro_batch_tokens=-1)


def test_the_model_switches_mode_only_when_the_pass_changes_it(model_dir, monkeypatch):
    """Scoring runs in eval mode and updates in train mode; ``train()`` (a walk over every module,
    costly in transformers) runs only where the mode changes."""
    engine = FSDPTrainEngine(model_dir, device="cpu", optim=OptimConfig(lr=0.0, grad_clip=0.0))
    batch = make_batch(4, prompt_len=5, resp_len=3, seed=2)
    calls, started = [], engine.model.training
    real = type(engine.model).train
    monkeypatch.setattr(type(engine.model), "train", lambda m, mode=True: calls.append(mode) or real(m, mode))
    engine.compute_log_prob(batch)
    engine.compute_log_prob(batch)
    assert not engine.model.training
    engine.train_batch(batch, token_mean_loss)
    assert engine.model.training and all(m.training for m in engine.model.modules())
    engine.train_batch(batch, token_mean_loss)
    engine.compute_log_prob(batch)
    assert not any(m.training for m in engine.model.modules())
    assert calls == [False] * started + [True, False]
