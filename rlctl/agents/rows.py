"""The endpoint's episodes as the trainer's batch: the same keys and layout as the native rollout's.

Each episode's chain (:mod:`.trajectory`) is its row: ``ids[:split]`` left-padded into the prompt
columns, the rest laid out in ``max_tokens`` response columns with ``response_mask`` 1 on sampled
tokens and ``rollout_log_probs`` their sampling log-probs (0 on context). A row whose agent sent no
request that sampled keeps the data row's prompt and an empty response (no token in a loss).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlctl.agents.trajectory import Chain
from rlctl.engines.logprob import position_ids_from_mask


def _col(values: Sequence[float]) -> torch.Tensor:
    return torch.tensor([float(v) for v in values], dtype=torch.float32)


def assemble(
    chains: Sequence[Chain | None],
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    width: int,
    pad_id: int,
    *,
    turns: Sequence[int],
    tool_calls: Sequence[int],
    tool_errors: Sequence[int],
    rewards: Sequence[float],
    truncated: Sequence[bool],
    mismatches: Sequence[int],
    failed: Sequence[bool],
) -> dict[str, torch.Tensor]:
    """Batch tensors for ``chains`` (one per episode), with the ``agent_*`` columns."""
    rows, p_width = len(chains), prompt_ids.shape[1]
    prompts = prompt_ids.cpu().long().clone()
    pmask = prompt_mask.cpu().long().clone()
    resp = torch.full((rows, width), pad_id, dtype=torch.long)
    attn = torch.zeros((rows, width), dtype=torch.long)
    rmask = torch.zeros((rows, width), dtype=torch.long)
    logp = torch.zeros((rows, width), dtype=torch.float32)
    for i, chain in enumerate(chains):
        if chain is None:
            continue
        head, tail = chain.ids[: chain.split], chain.ids[chain.split :][:width]
        prompts[i].fill_(pad_id)
        pmask[i].zero_()
        if head:
            prompts[i, p_width - len(head) :] = torch.tensor(head, dtype=torch.long)
            pmask[i, p_width - len(head) :] = 1
        n = len(tail)
        if n:
            resp[i, :n] = torch.tensor(tail, dtype=torch.long)
            attn[i, :n] = 1
            rmask[i, :n] = torch.tensor(chain.model[:n], dtype=torch.long)
            logp[i, :n] = torch.tensor(chain.log_probs[:n], dtype=torch.float32)
    mask = torch.cat([pmask, attn], dim=1)
    return {
        "prompts": prompts,
        "responses": resp,
        "input_ids": torch.cat([prompts, resp], dim=1),
        "attention_mask": mask,
        "position_ids": position_ids_from_mask(mask),
        "response_mask": rmask,
        "rollout_log_probs": logp,
        "agent_turns": _col(turns),
        "agent_tool_calls": _col(tool_calls),
        "agent_tool_errors": _col(tool_errors),
        "agent_reward": _col(rewards),
        "agent_success": _col([r > 0 for r in rewards]),  # NaN > 0 is False; the profile's reward decides acc
        "agent_truncated": _col(truncated),
        "agent_prefix_mismatch": _col(mismatches),
        "agent_errors": _col(failed),
    }
