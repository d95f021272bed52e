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


def column(values: Sequence[float]) -> torch.Tensor:
    """One float32 ``agent_*`` column of a batch."""
    return torch.tensor([float(v) for v in values], dtype=torch.float32)


def response_batch(
    prompts: torch.Tensor,
    prompt_mask: torch.Tensor,
    responses: Sequence[tuple[Sequence[int], Sequence[int], Sequence[float]] | None],
    width: int,
    pad_id: int,
) -> dict[str, torch.Tensor]:
    """The rollout batch's tensors for multi-turn rows: each row's ``(ids, model, log_probs)`` (None:
    an empty response) laid out in ``width`` response columns after the left-padded ``prompts``;
    ``response_mask`` is ``model`` (1 on sampled tokens), ``rollout_log_probs`` their log-probs."""
    rows = len(responses)
    resp = torch.full((rows, width), pad_id, dtype=torch.long)
    attn = torch.zeros((rows, width), dtype=torch.long)
    rmask = torch.zeros((rows, width), dtype=torch.long)
    logp = torch.zeros((rows, width), dtype=torch.float32)
    for i, response in enumerate(responses):
        if response is None:
            continue
        ids, model, log_probs = response
        n = min(len(ids), width)
        if n:
            resp[i, :n] = torch.tensor(ids[:n], dtype=torch.long)
            attn[i, :n] = 1
            rmask[i, :n] = torch.tensor(model[:n], dtype=torch.long)
            logp[i, :n] = torch.tensor(log_probs[:n], dtype=torch.float32)
    mask = torch.cat([prompt_mask, attn], dim=1)
    return {
        "prompts": prompts,
        "responses": resp,
        "input_ids": torch.cat([prompts, resp], dim=1),
        "attention_mask": mask,
        "position_ids": position_ids_from_mask(mask),
        "response_mask": rmask,
        "rollout_log_probs": logp,
    }


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
    answered: Sequence[bool],
    truncated: Sequence[bool],
    mismatches: Sequence[int],
    failed: Sequence[bool],
) -> dict[str, torch.Tensor]:
    """Batch tensors for ``chains`` (one per episode), with the ``agent_*`` columns."""
    p_width = prompt_ids.shape[1]
    prompts = prompt_ids.cpu().long().clone()
    pmask = prompt_mask.cpu().long().clone()
    responses = []
    for i, chain in enumerate(chains):
        if chain is None:
            responses.append(None)
            continue
        head = chain.ids[: chain.split]
        prompts[i].fill_(pad_id)
        pmask[i].zero_()
        if head:
            prompts[i, p_width - len(head) :] = torch.tensor(head, dtype=torch.long)
            pmask[i, p_width - len(head) :] = 1
        responses.append((chain.ids[chain.split :], chain.model, chain.log_probs))
    return response_batch(prompts, pmask, responses, width, pad_id) | {
        "agent_turns": column(turns),
        "agent_tool_calls": column(tool_calls),
        "agent_tool_errors": column(tool_errors),
        "agent_reward": column(rewards),
        "agent_success": column([r > 0 for r in rewards]),  # NaN > 0 is False; the profile's reward decides acc
        "agent_truncated": column(truncated),
        "agent_prefix_mismatch": column(mismatches),
        "agent_errors": column(failed),
        "agent_answered": column(answered),  # the agent returned a final answer (the answer column)
    }
