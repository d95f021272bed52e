"""Tiny local Qwen2 models and batches in the engines' convention (verl's)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import torch

VOCAB = 64
PAD = 0
EOS = 1


def log_prob_atol(device: str) -> float:
    """How far two fp32 computations of one log-prob may differ: bit-near on CPU; an accelerator's
    attention kernels and reduction order differ between the cached decode and the full forward."""
    return 1e-5 if device == "cpu" else 1e-4


def make_model(path: Path, *, tie: bool = False, seed: int = 0, layers: int = 2, **config) -> Path:
    """Save a random tiny Qwen2 causal LM to ``path`` and return it (``config`` overrides fields)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=2,
        **{"max_position_embeddings": 128, "vocab_size": VOCAB, **config},
    )
    model = Qwen2ForCausalLM(cfg)
    # larger-than-default init so the distributions are far from uniform
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    model.save_pretrained(str(path))
    return path


def make_batch(
    batch_size: int = 4, prompt_len: int = 6, resp_len: int = 5, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Random left-padded prompts + right-padded responses with varying lengths."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, VOCAB, (batch_size, prompt_len), generator=g)
    responses = torch.randint(3, VOCAB, (batch_size, resp_len), generator=g)
    prompt_mask = torch.ones(batch_size, prompt_len, dtype=torch.long)
    response_mask = torch.ones(batch_size, resp_len, dtype=torch.long)
    for i in range(batch_size):
        pl = 1 + (i * 3) % prompt_len
        rl = 1 + (i * 2 + 1) % resp_len
        prompt_mask[i, : prompt_len - pl] = 0
        prompts[i, : prompt_len - pl] = PAD
        response_mask[i, rl:] = 0
        responses[i, rl:] = PAD
        responses[i, rl - 1] = EOS if i % 2 == 0 else responses[i, rl - 1]
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return {
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "responses": responses,
        "response_mask": response_mask,
    }


def reference_log_probs(model, batch: dict[str, torch.Tensor], temperature: float = 1.0) -> torch.Tensor:
    """Plain HF forward, written out independently of the engine's helpers."""
    r = batch["responses"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits
    logits = logits[:, -r - 1 : -1].float() / temperature
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    return torch.gather(logp, 2, batch["responses"][..., None]).squeeze(-1)


def token_mean_loss(outputs, mb, scale):
    """-log-prob token-mean over the whole mini-batch, this micro-batch's exact share."""
    mask = mb["response_mask"].float()
    loss = -(outputs["log_probs"] * mask).sum() / scale.global_tokens * scale.dp_size
    return loss, {"loss": float(loss.detach())}


def advantage_loss(outputs, mb, scale):
    """Policy gradient ``-A * log-prob``, token-mean over the whole mini-batch (this micro-batch's
    share), its loss as metric parts."""
    from rlctl.algorithms.metric_parts import Mean

    mask = mb["response_mask"].float()
    loss = -(outputs["log_probs"] * mb["advantages"] * mask).sum() / scale.global_tokens * scale.dp_size
    return loss, {"loss": Mean(float(loss.detach()) / scale.dp_size * scale.global_tokens, float(mask.sum()))}


def seq_mean_loss(outputs, mb, scale):
    """Per-sequence token-mean, then mean over all sequences of the mini-batch."""
    mask = mb["response_mask"].float()
    per_seq = -(outputs["log_probs"] * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    loss = per_seq.sum() / scale.global_seqs * scale.dp_size
    return loss, {"loss": float(loss.detach())}


def seq_mean_token_sum_loss(outputs, mb, scale):
    """verl's seq-mean-token-sum: per-sequence token sum, mean over sequences."""
    mask = mb["response_mask"].float()
    loss = -(outputs["log_probs"] * mask).sum() / scale.global_seqs * scale.dp_size
    return loss, {"loss": float(loss.detach())}


def seq_mean_token_sum_norm_loss(outputs, mb, scale, horizon: int = 5):
    """verl's seq-mean-token-sum-norm (Dr. GRPO): token sum over a fixed horizon, mean over sequences."""
    mask = mb["response_mask"].float()
    loss = -(outputs["log_probs"] * mask).sum() / horizon / scale.global_seqs * scale.dp_size
    return loss, {"loss": float(loss.detach())}


def make_grouped_batch(
    groups: int = 2, n: int = 4, prompt_len: int = 6, resp_len: int = 5, seed: int = 0
) -> dict[str, torch.Tensor]:
    """GRPO's layout: ``n`` adjacent rows per prompt (identical prompt part), each its own response."""
    prompts = make_batch(groups, prompt_len, resp_len, seed)
    responses = make_batch(groups * n, prompt_len, resp_len, seed + 1)
    plen = prompt_len
    prompt_ids = prompts["input_ids"][:, :plen].repeat_interleave(n, 0)
    prompt_mask = prompts["attention_mask"][:, :plen].repeat_interleave(n, 0)
    attention_mask = torch.cat([prompt_mask, responses["response_mask"]], dim=1)
    return {
        "input_ids": torch.cat([prompt_ids, responses["responses"]], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "responses": responses["responses"],
        "response_mask": responses["response_mask"],
    }


def free_port() -> int:
    """A free loopback TCP port for a gloo rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_per_world_size(
    worker: Callable, base: Path, model_dir: Path, world_sizes: tuple[int, ...]
) -> dict[int, list[dict]]:
    """Run ``worker(rank, world, port, model_dir, out_dir)`` on each world size's gloo ranks; each
    rank saves ``rank{r}.pt`` in ``out_dir``. Returns every world size's per-rank results (rank 0's
    with ``dir``, the output folder)."""
    from rlctl.dispatch.local_ranks import spawn_ranks

    out = {}
    for world in world_sizes:
        out_dir = base / f"w{world}"
        out_dir.mkdir()
        spawn_ranks(worker, world, (world, free_port(), str(model_dir), str(out_dir)))
        out[world] = [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world)]
        out[world][0]["dir"] = out_dir
    return out


def tp2_policy_worker(rank: int, world: int, port: int, model_dir, rollout):
    """A ``PolicyWorker`` of ``world`` gloo ranks (the group already initialised) whose rollout
    engine ``rollout`` runs at TP 2 in contiguous groups, with an FSDP2 actor over ``model_dir``
    whose weights are moved off the checkpoint by a seeded draw (the sync has something to move)."""
    import types

    from rlctl.dispatch.mesh import Mesh
    from rlctl.dispatch.worker import WorkerContext
    from rlctl.engines.fsdp_train import FSDPTrainEngine
    from rlctl.profile.schema import ActorSection, RolloutSection
    from rlctl.trainer.plan.specs import RolloutSpec
    from rlctl.trainer.workers.roles import PolicyWorker

    worker = PolicyWorker.__new__(PolicyWorker)
    worker._rlctl_ctx = WorkerContext(
        role="policy", rank=rank, world_size=world, local_rank=rank, local_world_size=world,
        mesh=Mesh.of(None, world).with_rollout(2, "contiguous"), master_addr="127.0.0.1", master_port=port,
    )  # fmt: skip
    worker.spec = types.SimpleNamespace(  # with the engine's settings: the canary runs
        engine=types.SimpleNamespace(mixed_precision=None, dtype="float32"),
        loss=types.SimpleNamespace(actor=ActorSection()),  # no offload: the canary runs in place
        rollout=RolloutSpec(section=RolloutSection(tensor_parallel=2)),
        lora=None,
    )
    worker.actor = FSDPTrainEngine(model_dir)
    worker.rollout = rollout
    g = torch.Generator().manual_seed(1000 + rank)  # the trainer's weights move off the checkpoint
    with torch.no_grad():
        for _, p in worker.actor.model.named_parameters():
            p.to_local().add_(0.01 * torch.randn(p.to_local().shape, generator=g))
    return worker
