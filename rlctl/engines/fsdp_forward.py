"""The training engine's forwards: one micro-batch's response log-probs / entropy or values, in
the cheapest layout that computes the same thing (:class:`TrainForwards`, a base of
:class:`rlctl.engines.fsdp_train.FSDPTrainEngine`):

1. packed, one row per prompt group (:mod:`rlctl.engines.packing`), where the model's attention
   takes a 4-D mask and the batch has a shared prompt or response padding to remove;
2. each distinct prompt once, the responses on its KV cache (:mod:`rlctl.engines.prefix`);
3. verl's padded rows as given.

Under FSDP every forward is a collective, so every rank takes the same path (:meth:`_all_ranks`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from rlctl.engines.logprob import (
    position_ids_from_mask,
    response_logits,
    token_log_probs,
    token_log_probs_and_entropy,
)
from rlctl.engines.packing import PackedBatch, pack_if_worth
from rlctl.engines.prefix import PrefixGroups, prompt_groups, shared_prefix_logits

Batch = dict[str, torch.Tensor]


def _scores(logits, targets, temperature: float, with_entropy: bool, unpack=lambda x: x) -> dict:
    """``log_probs`` (and ``entropy``) of ``targets`` under ``logits``, laid out by ``unpack``."""
    if with_entropy:
        lp, ent = token_log_probs_and_entropy(logits, targets, temperature)
        return {"log_probs": unpack(lp), "entropy": unpack(ent)}
    return {"log_probs": unpack(token_log_probs(logits, targets, temperature))}


class TrainForwards:
    """Forward paths over ``self.model``; the engine provides ``device``, ``distributed``, ``pack``,
    ``share_prefix``, ``value_head``, ``_keep_logits``, ``_group()`` and ``_autocast()``."""

    def _forward(self, mb: Batch, *, temperature: float, with_entropy: bool) -> dict[str, torch.Tensor]:
        """Log-probs (+entropy) or values of the response tokens of one micro-batch."""
        mb = {k: v.to(self.device) for k, v in mb.items()}
        resp_len = mb["responses"].shape[1]
        position_ids = mb.get("position_ids")
        if position_ids is None:
            position_ids = position_ids_from_mask(mb["attention_mask"])
        inputs = dict(
            input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=position_ids
        )
        packed = self._packed(inputs, resp_len)
        if packed is not None:
            return self._packed_forward(packed, temperature=temperature, with_entropy=with_entropy)
        with self._autocast():
            if self.value_head:
                values = self.model(**inputs)
                return {"values": values[:, -resp_len - 1 : -1].float()}
            logits = self._shared_prefix_logits(inputs, resp_len)
            if logits is None:
                if self._keep_logits:
                    logits = self.model(**inputs, use_cache=False, logits_to_keep=resp_len + 1).logits
                else:
                    logits = self.model(**inputs, use_cache=False).logits
                logits = response_logits(logits, resp_len)
        return _scores(logits, mb["responses"], temperature, with_entropy)

    def _all_ranks(self, flag: bool, op=dist.ReduceOp.MIN) -> bool:
        """``flag`` over the DP ranks (MIN: on all of them, MAX: on any): under FSDP every forward is
        a collective, so every rank must take the same path. Itself when not distributed."""
        if not self.distributed:
            return flag
        value = torch.tensor([int(flag)], device=self.device)
        dist.all_reduce(value, op=op, group=self._group())
        return bool(int(value))

    def _packed(self, inputs: Batch, resp_len: int) -> PackedBatch | None:
        """The micro-batch packed one row per prompt group where that removes work
        (:func:`rlctl.engines.packing.pack_if_worth`) on every rank, else None."""
        if not self.pack:
            return None
        packed = pack_if_worth(**inputs, response_length=resp_len)
        return packed if self._all_ranks(packed is not None) else None

    def _packed_forward(self, packed: PackedBatch, *, temperature: float, with_entropy: bool) -> dict:
        with self._autocast():
            if self.value_head:
                return {"values": packed.unpack(self.model(**packed.inputs())[:, -packed.keep :].float())}
            keep = {"logits_to_keep": packed.keep} if self._keep_logits else {}
            logits = self.model(**packed.inputs(), use_cache=False, **keep).logits[:, -packed.keep :]
        return _scores(logits, packed.targets, temperature, with_entropy, packed.unpack)

    def _shared_prefix_logits(self, inputs: Batch, resp_len: int) -> torch.Tensor | None:
        """Response logits with each distinct prompt computed once (:mod:`rlctl.engines.prefix`);
        None where no rows share a prompt or the model cannot reuse its cache here. Under FSDP the
        two-pass path as soon as any rank shares a prompt (ranks without sharing then share nothing)."""
        if not self.share_prefix:
            return None
        plen = inputs["input_ids"].shape[1] - resp_len
        groups = prompt_groups(inputs["input_ids"][:, :plen], inputs["attention_mask"][:, :plen])
        if not self._all_ranks(groups is not None, dist.ReduceOp.MAX):
            return None
        groups = groups or PrefixGroups.each_row(len(inputs["input_ids"]), self.device)
        return shared_prefix_logits(
            self.model, **inputs, response_length=resp_len, groups=groups, keep_logits=self._keep_logits
        )
