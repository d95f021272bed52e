"""Shared prompt prefixes: compute a prompt once for all the samples drawn from it.

GRPO-style batches hold ``n`` responses per prompt in adjacent rows. Both engines run the
prompt part once per distinct prompt and let every sample attend to that one KV cache:

- rollout: the prefill runs on the distinct prompts only, then the cache rows are repeated;
- training: a forward over the distinct prompts (with gradients, returning its KV cache), the
  cache rows repeated per sample, then a forward over the responses on top of it. The backward
  of the repeat sums the samples' gradients into the shared prompt pass, so the loss and its
  gradient are those of the full per-row forward; only the float summation order differs
  (bounded in the tests).

At 8 prompt tokens, 4 response tokens and ``n = 8`` that is 2.4x fewer tokens through the model.
The cache is the model's own (``DynamicCache``); models or settings whose cache cannot be reused
under autograd (activation checkpointing drops it) take the plain path, and so do models whose
rotary frequencies depend on the length of the forward (:func:`length_dependent_rope`: the
prompt pass would rotate with other frequencies than the full forward). Under FSDP every forward
is a collective, so all ranks take the same path (the training engine agrees on it per
micro-batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlctl.engines.hf_model import cache_kwarg, output_cache


@dataclass(frozen=True)
class PrefixGroups:
    """Rows grouped by identical prompt: ``first[g]`` is group g's first row, ``row_group[i]`` row i's group."""

    first: torch.Tensor
    row_group: torch.Tensor

    @classmethod
    def each_row(cls, rows: int, device: torch.device | str = "cpu") -> PrefixGroups:
        """Every row its own group (the two-pass forward without sharing)."""
        index = torch.arange(rows, device=device)
        return cls(first=index, row_group=index)


def _rope_types(config: Any) -> list[str]:
    """Every ``rope_type`` a config declares: ``rope_parameters`` (transformers 5, one dict or one
    per layer type) and the older ``rope_scaling`` (``rope_type`` or ``type``), text config included."""
    configs = [config]
    text = config.get_text_config() if hasattr(config, "get_text_config") else None
    if text is not None and text is not config:
        configs.append(text)
    found = []
    for cfg in configs:
        for attr in ("rope_parameters", "rope_scaling"):
            params = getattr(cfg, attr, None)
            if not isinstance(params, dict):
                continue
            for entry in [params, *(v for v in params.values() if isinstance(v, dict))]:
                kind = entry.get("rope_type", entry.get("type"))
                if isinstance(kind, str):
                    found.append(kind)
    return found


def length_dependent_rope(config: Any) -> str | None:
    """The config's rope type whose frequencies follow the longest position of each forward, as
    transformers' ``dynamic_rope_update`` does for a type containing ``dynamic`` and for
    ``longrope``; None when there is none (prefix sharing is exact)."""
    for kind in _rope_types(config):
        if "dynamic" in kind or kind == "longrope":
            return kind
    return None


def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> PrefixGroups | None:
    """Runs of adjacent rows with the same prompt tokens and mask; None when no two adjacent rows share one."""
    if prompt_ids.shape[0] < 2:
        return None
    key = torch.cat([prompt_ids.long(), prompt_mask.long()], dim=1)
    same_as_previous = (key[1:] == key[:-1]).all(dim=1)
    if not bool(same_as_previous.any()):
        return None
    new_group = torch.cat([torch.ones(1, dtype=torch.bool, device=key.device), ~same_as_previous])
    return PrefixGroups(first=torch.nonzero(new_group).squeeze(1), row_group=new_group.long().cumsum(0) - 1)


def repeat_cache_rows(cache, index: torch.Tensor) -> bool:
    """Reorder/repeat a KV cache's batch rows in place (``index`` per new row); False if it cannot."""
    select = getattr(cache, "batch_select_indices", None)
    if select is None:
        return False
    select(index)
    return True


def cache_rows_selectable(cache) -> bool:
    """Whether every layer of ``cache`` holds its batch in keys/values alone, so that
    ``batch_select_indices`` keeps exactly the chosen rows: transformers 5.x ``DynamicLayer`` and
    ``DynamicSlidingWindowLayer`` (cache_utils.py). Linear-attention, quantized and static layers
    hold other per-row state that method leaves behind, or lack it."""
    if getattr(cache, "batch_select_indices", None) is None:
        return False
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers)


def shared_prefix_logits(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    groups: PrefixGroups,
    keep_logits: bool,
) -> torch.Tensor | None:
    """Logits (B, R, V) that predict the R response tokens of each row, the prompt computed once per
    group (module docstring); None when the model returned no reusable cache (caller falls back).

    Rows are verl's layout: a left-padded prompt of width P followed by a right-padded response.
    """
    width = input_ids.shape[1]
    plen = width - response_length
    first, rows = groups.first, groups.row_group
    head = {"logits_to_keep": 1} if keep_logits else {}
    out = model(
        input_ids=input_ids[first, :plen],
        attention_mask=attention_mask[first, :plen],
        position_ids=position_ids[first, :plen],
        use_cache=True,
        **head,
    )
    first_token = out.logits[:, -1:][rows]  # the last prompt position predicts response token 0
    if response_length == 1:
        return first_token
    cache = output_cache(out)
    if cache is None or not repeat_cache_rows(cache, rows):
        return None
    rest = model(
        input_ids=input_ids[:, plen : width - 1],
        attention_mask=attention_mask[:, : width - 1],
        position_ids=position_ids[:, plen : width - 1],
        use_cache=True,
        **{cache_kwarg(model): cache},
    ).logits
    return torch.cat([first_token, rest], dim=1)
