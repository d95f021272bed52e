"""The rollout call every rollout-holding worker makes: one response per row, padded to a fixed width."""

from __future__ import annotations

from typing import Any

import torch

from rlctl.dispatch import DataProto


def sample_rows(rollout: Any, prompts: DataProto, rank: int, **inflight: Any) -> dict[str, torch.Tensor]:
    """One response per row of ``prompts`` with the sampling settings in its meta, seeded by the
    request's seed and ``rank``, padded to ``max_new_tokens``: every rollout worker's generate.
    ``inflight``: ``version=`` and ``swap=`` for in-flight weight swaps (:mod:`rlctl.engines.inflight`).
    A request with ``limits`` (carried partial rollouts, :mod:`rlctl.trainer.loops.carry`) caps each
    row's new tokens and stops at ``stop_share`` rows still running (``finished`` per row)."""
    meta = prompts.meta
    if "limits" in prompts.batch:
        inflight = {**inflight, "limits": prompts.batch["limits"], "stop_share": float(meta["stop_share"])}
    out = rollout.generate(
        prompts.batch["input_ids"],
        prompts.batch["attention_mask"],
        n=1,
        temperature=float(meta.get("temperature", 1.0)),
        top_p=float(meta.get("top_p", 1.0)),
        top_k=int(meta.get("top_k", 0)),
        max_new_tokens=int(meta["max_new_tokens"]),
        greedy=bool(meta.get("greedy", False)),
        eos_token_id=meta["eos_token_id"],
        pad_token_id=meta["pad_token_id"],
        seed=int(meta["seed"]) * 1_000_003 + rank,
        **inflight,
    )
    return _pad_responses(out, int(meta["max_new_tokens"]), int(meta["pad_token_id"]))


def _pad_responses(out: dict[str, torch.Tensor], length: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad the response part to a fixed length so every rank returns the same shapes.

    Each pad is made on its tensor's own device and dtype, so this works wherever the engine
    left its outputs.
    """
    resp = out["responses"]
    extra = length - resp.shape[1]
    if extra <= 0:
        return out
    b = resp.shape[0]

    def zeros_like_rows(t: torch.Tensor) -> torch.Tensor:
        return torch.zeros((b, extra), dtype=t.dtype, device=t.device)

    pad_tok = torch.full((b, extra), pad_id, dtype=resp.dtype, device=resp.device)
    padded = dict(out)
    padded["responses"] = torch.cat([resp, pad_tok], 1)
    padded["input_ids"] = torch.cat([out["input_ids"], pad_tok.to(out["input_ids"])], 1)
    for key in ("response_mask", "attention_mask", "rollout_log_probs", "token_versions"):
        if key in out:
            padded[key] = torch.cat([out[key], zeros_like_rows(out[key])], 1)
    pos = out["position_ids"]
    steps = torch.arange(1, extra + 1, dtype=pos.dtype, device=pos.device)
    padded["position_ids"] = torch.cat([pos, pos[:, -1:] + steps], 1)
    return padded
