"""Packed training forwards: one row per prompt group, no padding between responses.

verl's batch layout pads every row to the widest prompt and the longest response, and a GRPO
batch repeats each prompt ``n`` times. The training engine instead runs one packed row per group
of rows that share a prompt::

    [ prompt[:-1] | prompt[-1] r1 ... | prompt[-1] r2 ... | ... | pad ]

- the prompt, bar its last token, once for the group; every response is a segment that starts
  with its own copy of the prompt's last token (the position that predicts its first token) and
  holds only its real tokens, at the positions it has in verl's layout;
- a 4-D boolean attention mask lets a token see the shared prompt and the earlier tokens of its
  own segment, nothing else; a padding position sees the prompt only (its output is unused);
- the logits of every segment position predict the next token of that segment, so each response
  token has exactly one predicting position and the log-prob / entropy helpers run on the packed
  tensor as they do on verl's.

The loss and its gradient are the per-row forward's: each response sees the same keys at the
same positions; only float summation order differs (bounded in the tests). At 8 prompts of 46
tokens x 4 responses of <= 24 (SmolLM2's profile) that is 1136 instead of 2240 token positions,
in one forward whose matrix products are 3-6x taller than the two passes of :mod:`.prefix`.

Needs an attention that takes an arbitrary mask: transformers' ``sdpa`` from 4.53 on, whose
``masking_utils`` passes a 4-D mask through as given (``_preprocess_mask_arguments``: "If the
mask is already 4D, simply return as-is"). ``eager`` would add a boolean mask to the scores and
flash-attention ignores masks, so those, older releases and length-dependent RoPE
(:func:`rlctl.engines.prefix.length_dependent_rope`) keep the two-pass or plain path.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch
from torch import nn

from rlctl.engines.prefix import PrefixGroups, length_dependent_rope, prompt_groups


def can_pack(model: nn.Module) -> bool:
    """Whether ``model`` takes the packed layout exactly: sdpa attention under a transformers
    that passes 4-D masks through, and RoPE frequencies that do not follow the row length."""
    config = getattr(model, "config", None)
    if config is None or importlib.util.find_spec("transformers.masking_utils") is None:
        return False
    return getattr(config, "_attn_implementation", None) == "sdpa" and not length_dependent_rope(config)


@dataclass(frozen=True)
class PackedBatch:
    """One packed row per group; ``source[i, t]`` is the packed position (flat over rows) whose
    logits predict response token ``t`` of batch row ``i``, ``valid[i, t]`` whether that token exists."""

    input_ids: torch.Tensor  # (G, L)
    position_ids: torch.Tensor  # (G, L)
    attention_mask: torch.Tensor  # (G, 1, L, L) bool, True = attend
    targets: torch.Tensor  # (G, K): the token each of the last K positions predicts (0 where none)
    keep: int  # K: positions from the first segment on; the logits the caller needs
    source: torch.Tensor  # (B, R) flat index into (G, K)
    valid: torch.Tensor  # (B, R) bool

    def inputs(self) -> dict[str, torch.Tensor]:
        """The model's keyword arguments for the packed rows."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
        }

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """(G, K) per-position values -> (B, R) per response token, 0 where there is no token."""
        flat = packed.reshape(-1)[self.source]
        return torch.where(self.valid, flat, torch.zeros_like(flat))


def response_lengths(attention_mask: torch.Tensor, response_length: int) -> torch.Tensor | None:
    """Each row's response length, or None unless every response is a run of ones then zeros
    (the layout a packed row can hold)."""
    part = attention_mask[:, attention_mask.shape[1] - response_length :].long()
    lengths = part.sum(-1)
    steps = torch.arange(response_length, device=part.device)
    if not bool((part == (steps < lengths[:, None]).long()).all()):
        return None
    return lengths


def pack(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    groups: PrefixGroups,
) -> PackedBatch | None:
    """The packed layout of a verl-layout batch (module docstring); None when a response is not
    a contiguous run (the caller keeps the padded layout)."""
    lengths = response_lengths(attention_mask, response_length)
    if lengths is None:
        return None
    device = input_ids.device
    rows, width = input_ids.shape
    plen = width - response_length
    shared = plen - 1  # the prompt bar its last token, once per group
    first, row_group = groups.first, groups.row_group
    ngroups = len(first)
    seg_len = lengths + 1
    # each row's segment start inside its group's row: after the shared prompt and the earlier
    # segments of the same group (rows of a group are adjacent)
    ends = seg_len.cumsum(0)
    group_start = torch.zeros(ngroups, dtype=torch.long, device=device)
    group_start[1:] = ends[first[1:] - 1]
    seg_start = shared + ends - seg_len - group_start[row_group]
    total = torch.zeros(ngroups, dtype=torch.long, device=device).index_add_(0, row_group, seg_len)
    length = shared + int(total.max())

    ids = torch.zeros(ngroups, length, dtype=input_ids.dtype, device=device)
    pos = torch.zeros(ngroups, length, dtype=position_ids.dtype, device=device)
    seg = torch.full((ngroups, length), -2, dtype=torch.long, device=device)  # -2: padding
    ids[:, :shared] = input_ids[first, :shared]
    pos[:, :shared] = position_ids[first, :shared]
    seg[:, :shared] = torch.where(attention_mask[first, :shared].bool(), -1, -2)  # -1: shared prompt

    # every segment token at once: row i's token j (j = 0 is the prompt's last token)
    offsets = torch.arange(response_length + 1, device=device)
    present = offsets[None, :] < seg_len[:, None]  # (B, R + 1)
    cols = (seg_start[:, None] + offsets[None, :])[present]
    grp = row_group[:, None].expand(rows, response_length + 1)[present]
    ids[grp, cols] = input_ids[:, plen - 1 :][present]
    pos[grp, cols] = position_ids[:, plen - 1 :][present]
    seg[grp, cols] = torch.arange(rows, device=device)[:, None].expand(rows, response_length + 1)[present]

    index = torch.arange(length, device=device)
    causal = index[:, None] >= index[None, :]
    same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] >= 0)
    prompt_key = (seg == -1)[:, None, :]
    mask = (causal & (same | prompt_key)) | torch.eye(length, dtype=torch.bool, device=device)

    keep = length - shared
    # position c predicts the token at c + 1 of the same segment
    nxt = torch.zeros_like(ids)
    nxt[:, :-1] = ids[:, 1:]
    follows = torch.zeros_like(seg, dtype=torch.bool)
    follows[:, :-1] = (seg[:, 1:] == seg[:, :-1]) & (seg[:, :-1] >= 0)
    targets = torch.where(follows, nxt, torch.zeros_like(nxt))[:, shared:]

    steps = torch.arange(response_length, device=device)
    valid = steps[None, :] < lengths[:, None]
    local = (seg_start[:, None] + steps[None, :] - shared).clamp(max=keep - 1)
    source = torch.where(valid, row_group[:, None] * keep + local, torch.zeros_like(local))
    return PackedBatch(
        input_ids=ids,
        position_ids=pos,
        attention_mask=mask[:, None],
        targets=targets,
        keep=keep,
        source=source,
        valid=valid,
    )


def pack_if_worth(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, response_length: int
) -> PackedBatch | None:
    """:func:`pack` where it removes work, a shared prompt or response padding; None otherwise (the
    rows as given keep the causal kernels: the one-row sync canary compares with the rollout
    engine's own causal forward) and where :func:`pack` cannot hold the batch."""
    plen = input_ids.shape[1] - response_length
    if plen <= 0:
        return None
    groups = prompt_groups(input_ids[:, :plen], attention_mask[:, :plen])
    if groups is None and not bool((attention_mask[:, plen:] == 0).any()):
        return None
    groups = groups or PrefixGroups.each_row(len(input_ids), input_ids.device)
    return pack(input_ids, attention_mask, position_ids, response_length, groups)
