"""HF transformers rollout engine: batched sampling with a KV cache, on any torch device.

The sampling loop is written here rather than delegated to ``model.generate`` so the per-token
log-probs are exactly ``log_softmax(logits / temperature)`` of the logits the token was drawn from
(no processor in between), computed with the same helper the training engine uses.

Output follows the engines' batch convention (see :mod:`rlctl.engines.fsdp_train`) plus
``prompts`` and ``rollout_log_probs``. Responses are padded to ``max_new_tokens``; the
``n`` samples of a prompt are adjacent rows. Inputs may live anywhere (they are moved to the
engine's device); outputs always come back on the host, so the driver-side stages never see
device tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch import nn

from rlctl.devices import runtime_of
from rlctl.engines import hf_tp
from rlctl.engines.fingerprint import fingerprint_sharded, fingerprint_views
from rlctl.engines.hf_model import cache_kwarg, load_causal_lm, output_cache, supports_logits_to_keep
from rlctl.engines.inflight import KV_ON_SWAP, Swap
from rlctl.engines.logprob import position_ids_from_mask, scaled_log_softmax, token_log_probs
from rlctl.engines.lora import LoraSpec, inject
from rlctl.engines.prefix import (
    cache_rows_selectable,
    length_dependent_rope,
    prompt_groups,
    repeat_cache_rows,
)
from rlctl.engines.registry import register_engine
from rlctl.engines.sampling import draw_uniforms, sample_tokens
from rlctl.engines.weight_delta import TensorDelta, apply
from rlctl.errors import RunError, UserError

DROP_FRACTION = 0.25
"""Decode stops running finished rows once this share of the rows it runs has finished since the
last drop: dropping copies the KV cache, so it waits until the rows saved pay for the copy."""


def _accel(device: torch.device):
    """The ``torch.<device>`` module (cuda, npu, xpu, ...) or None on CPU."""
    return runtime_of(device).module


@register_engine("rollout", model_type="*", backend="hf", device="*")
class HFRolloutEngine:
    """Rollout with an HF causal LM: ``generate``, ``update_weights``, ``sleep``/``wake``."""

    adapter_sync = True  # built with ``lora``, it takes a LoRA actor's adapter tensors alone
    shares_trainer_base = True  # may be built from the trainer's model (frozen base tensors shared)
    # its forward reads the module's own parameters, the tensors weight_fingerprint reads (the
    # sync canary is then a spot check: rlctl.trainer.state.canary.canary_due)
    computes_with_stored_weights = True

    def __init__(
        self,
        model_path_or_module: str | Path | nn.Module,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        attn_implementation: str = "sdpa",
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
        seed: int = 0,
        lora: LoraSpec | None = None,
        rank_order: str = "contiguous",
    ):
        """``gpu_memory_utilization`` is for engines that pre-allocate a KV cache (vLLM, SGLang);
        this engine allocates as it goes and ignores it. ``seed`` is unused: every ``generate``
        call takes its own. ``lora``: the base is held once with the trainer's adapter layers
        injected (:mod:`rlctl.engines.lora`); a sync then sends only the adapter tensors, copied
        in place under the same names.

        ``tensor_parallel_size > 1`` (:mod:`rlctl.engines.hf_tp`): every rank of the initialised
        default process group builds the model on the meta device, splits it by the model's TP plan
        over its replica's ranks (``rank_order``: contiguous or strided TP groups) and allocates only
        its shards, uninitialised: the weight sync fills them."""
        self.device = torch.device(device)
        self.tp = tensor_parallel_size
        self.tp_group, self.tp_splits = None, {}
        if self.tp > 1:
            self.model = self._sharded_model(
                model_path_or_module, dtype, trust_remote_code, attn_implementation, lora, rank_order
            )
        elif isinstance(model_path_or_module, nn.Module):
            model = model_path_or_module
        else:
            model = load_causal_lm(
                model_path_or_module,
                dtype=dtype,
                trust_remote_code=trust_remote_code,
                attn_implementation=attn_implementation,
            )
        if self.tp == 1:
            if lora is not None:
                inject(model, lora)
            self.model = model.to(self.device).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self._cache_kw = cache_kwarg(self.model)
        self._keep_logits = supports_logits_to_keep(self.model)
        self._rope_by_length = length_dependent_rope(self.model.config) is not None
        self.asleep = False

    def _sharded_model(
        self, source, dtype, trust_remote_code, attn_implementation, lora, rank_order
    ) -> nn.Module:
        """The model split over this rank's TP group, only its shards allocated (see ``__init__``)."""
        import torch.distributed as dist

        if lora is not None or isinstance(source, nn.Module) or not dist.is_initialized():
            why = (
                "a LoRA actor"
                if lora is not None
                else "a model object"
                if isinstance(source, nn.Module)
                else "no initialised process group"
            )
            raise UserError(f"rollout.tensor_parallel = {self.tp}: the HF engine cannot split {why}; set 1")
        model = hf_tp.build_meta_model(
            source, dtype=dtype, trust_remote_code=trust_remote_code, attn_implementation=attn_implementation
        )
        mesh = hf_tp.rollout_mesh(self.device.type, dist.get_world_size(), self.tp, rank_order)["tp"]
        self.tp_group = mesh.get_group()
        plan = hf_tp.declared_plan(model)
        self.tp_splits = hf_tp.apply_plan(model, plan, self.tp_group, self.tp, mesh.get_local_rank())
        hf_tp.materialize(model, self.device, tied=bool(getattr(model.config, "tie_word_embeddings", False)))
        return model.eval()

    # -- generation --------------------------------------------------------------------------------
    def _step(self, input_ids, attention_mask, position_ids, cache):
        kwargs = {"use_cache": True, self._cache_kw: cache}
        if self._keep_logits:
            kwargs["logits_to_keep"] = 1
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
        )
        return out.logits[:, -1], output_cache(out)

    def _prefill(self, prompts: torch.Tensor, pmask: torch.Tensor):
        """The prompts' forward, each distinct prompt once (:mod:`rlctl.engines.prefix`): the n
        samples of a prompt are adjacent rows and share its KV cache."""
        positions = position_ids_from_mask(pmask)
        groups = None if self._rope_by_length else prompt_groups(prompts, pmask)
        if groups is None:
            return self._step(prompts, pmask, positions, None)
        first = groups.first
        logits, cache = self._step(prompts[first], pmask[first], positions[first], None)
        if not repeat_cache_rows(cache, groups.row_group):
            return self._step(prompts, pmask, positions, None)
        return logits[groups.row_group], cache

    @torch.inference_mode()  # no autograd bookkeeping at all: ~5% of a SmolLM2 generate
    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        max_new_tokens: int,
        greedy: bool = False,
        eos_token_id: int | Sequence[int] | None = None,
        pad_token_id: int = 0,
        seed: int | None = None,
        version: int | None = None,
        swap: Swap | None = None,
        kv_on_swap: str = "recompute",
        limits: torch.Tensor | None = None,
        stop_share: float = 0.0,
    ) -> dict[str, torch.Tensor]:
        """Sample ``n`` responses per left-padded prompt, stopping each row at EOS.

        Carried partial rollouts (:mod:`rlctl.trainer.loops.carry`): ``limits`` (one per output
        row) caps each row's new tokens below ``max_new_tokens``; with ``stop_share > 0`` the call
        returns once at most that share of its rows is still running, and ``finished`` (bool per
        row: EOS or its limit reached) tells the rows cut short from the rows done.

        In-flight weight updates (:mod:`rlctl.engines.inflight`): with ``version`` given, the
        output has ``token_versions`` (the weight version each response token was sampled with;
        0 past the response). ``swap()`` is asked between decode steps; when it returns
        ``(new version, (name, tensor) stream)`` the weights are loaded in place and the running
        rows go on under them. ``kv_on_swap``: ``recompute`` runs one forward of every running row's
        tokens so far under the new weights (its KV cache rebuilt: each later token's log-prob is
        exactly the new weights' score of it); ``keep`` goes on with the cache of the old weights
        (PipelineRL's choice: no extra forward; later tokens attend to keys and values the new
        weights would not have computed, so their log-probs are not the new weights' scores).

        ``rollout_log_probs[i, t]`` is the log-prob of ``responses[i, t]`` under
        ``softmax(logits / temperature)`` before top-k/top-p truncation (0 past the response).
        ``greedy`` takes the argmax (log-probs still use ``temperature``). ``eos_token_id=None``
        never stops early. ``seed`` seeds a generator on the engine's device (``None``: unseeded);
        the same seed gives the same samples on the same device. Returns CPU tensors.

        Finished rows leave the decode batch (their KV-cache rows dropped) once a ``DROP_FRACTION``
        share of the running rows has finished; every step still draws one uniform per row of the
        whole batch, so the samples are the same as when every row runs to the end.
        """
        if self.asleep:
            raise RunError("HF rollout engine is asleep; call wake() before generate()")
        if n < 1 or max_new_tokens < 1:
            raise UserError(
                f"generate needs n >= 1 and max_new_tokens >= 1, got n={n}, max_new_tokens={max_new_tokens}"
            )
        if temperature <= 0:
            raise UserError(f"temperature={temperature} must be > 0 (use greedy=True for argmax decoding)")
        dev = self.device
        prompts = prompt_ids.to(dev).repeat_interleave(n, dim=0)
        pmask = prompt_mask.to(dev).long().repeat_interleave(n, dim=0)
        bsz, plen = prompts.shape
        # on the tensors' own device: an accelerator draw with a CPU generator raises. On CPU this
        # is torch.Generator().manual_seed(seed), so CPU samples depend on the seed alone.
        generator = None if seed is None else torch.Generator(device=prompts.device).manual_seed(seed)
        stops = [] if eos_token_id is None else torch.tensor(eos_token_id).view(-1).tolist()
        eos = torch.tensor(stops, dtype=torch.long, device=dev)
        mask = torch.zeros(bsz, plen + max_new_tokens, dtype=torch.long, device=dev)
        mask[:, :plen] = pmask
        responses = torch.full((bsz, max_new_tokens), pad_token_id, dtype=prompts.dtype, device=dev)
        log_probs = torch.zeros(bsz, max_new_tokens, dtype=torch.float32, device=dev)
        finished = torch.zeros(bsz, dtype=torch.bool, device=dev)
        next_pos = pmask.sum(-1, keepdim=True)
        if kv_on_swap not in KV_ON_SWAP:
            raise UserError(f"kv_on_swap must be one of {KV_ON_SWAP}, got {kv_on_swap!r}")
        versions = torch.zeros(bsz, max_new_tokens, dtype=torch.long, device=dev)
        current = 0 if version is None else int(version)

        row_limits = None if limits is None else limits.to(dev).long().view(-1)
        logits, cache = self._prefill(prompts, pmask)
        # the rows the model still runs: all of them (a slice: views, no index copies) until the
        # first drop, then their full-batch indices
        run: slice | torch.Tensor = slice(None)
        # not under a dynamic rope: its frequencies follow the longest position in the batch
        can_drop = not self._rope_by_length and cache_rows_selectable(cache)
        for t in range(max_new_tokens):
            logp = scaled_log_softmax(logits, temperature)
            # one draw for the whole batch every step, as when no row is dropped: the samples
            # depend on the seed alone, not on which rows finished when
            uniforms = None if greedy else draw_uniforms((bsz, 1), dev, generator)[run]
            tok = sample_tokens(logp, top_k=top_k, top_p=top_p, greedy=greedy, uniforms=uniforms)
            alive = ~finished[run]
            tok = torch.where(alive, tok, torch.full_like(tok, pad_token_id))
            responses[run, t] = tok
            log_probs[run, t] = torch.where(alive, logp.gather(-1, tok[:, None]).squeeze(-1), 0.0)
            mask[run, plen + t] = alive.long()
            versions[run, t] = alive.long() * current
            if eos.numel():
                finished[run] = ~alive | torch.isin(tok, eos)
            if row_limits is not None:
                finished[run] |= row_limits[run] <= t + 1
            if t == max_new_tokens - 1:
                finished[run] = True
                break
            alive = ~finished[run]
            n_alive = int(alive.sum())
            if n_alive == 0 or n_alive <= stop_share * bsz:  # the rest is carried to the next call
                break
            if can_drop and (tok.shape[0] - n_alive) >= DROP_FRACTION * tok.shape[0]:
                keep = alive.nonzero().squeeze(1)
                # DynamicCache.batch_select_indices (transformers 5.x cache_utils.py: each
                # DynamicLayer keeps keys[indices, ...] / values[indices, ...]): a copy of the cache
                repeat_cache_rows(cache, keep)
                run, tok = (keep if isinstance(run, slice) else run[keep]), tok[keep]
            if swap is not None and (new := swap()) is not None:
                current = int(new[0])
                self.update_weights(new[1])
                if kv_on_swap == "recompute":  # the running rows' cache, rebuilt under the new weights
                    seen = mask[run, : plen + t + 1]
                    ids = torch.cat([prompts[run], responses[run, : t + 1]], dim=1)
                    logits, cache = self._step(ids, seen, position_ids_from_mask(seen), None)
                    continue
            logits, cache = self._step(tok[:, None], mask[run, : plen + t + 1], next_pos[run] + t, cache)

        out = {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": mask,
            "position_ids": position_ids_from_mask(mask),
            "response_mask": mask[:, plen:],
            "rollout_log_probs": log_probs,
        }
        if version is not None:
            out["token_versions"] = versions
        if limits is not None or stop_share > 0:
            out["finished"] = finished
        # plain host tensors for the caller: inference tensors refuse in-place updates outside
        with torch.inference_mode(False):
            return {k: v.to("cpu", copy=True) for k, v in out.items()}

    @torch.no_grad()
    def prompt_log_probs(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Log-prob of each token after the first given the ones before it (temperature 1), from
        one forward of the engine's own model: what the weight-sync canary compares with the
        trainer. Returns a host float32 tensor of ``len(token_ids) - 1`` values."""
        if self.asleep:
            raise RunError("HF rollout engine is asleep; call wake() before prompt_log_probs()")
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        logits = self.model(input_ids=ids, use_cache=False).logits[0, :-1]
        return token_log_probs(logits, ids[0, 1:]).cpu()

    # -- weights and memory ------------------------------------------------------------------------
    def _named_tensors(self) -> dict[str, torch.Tensor]:
        """Every parameter under each of its HF names (tied ones twice; under TP this rank's
        shard) plus the buffers."""
        tensors = dict(self.model.named_parameters(remove_duplicate=False))
        tensors.update(dict(self.model.named_buffers()))
        return tensors

    def local_tensors(self) -> dict[str, torch.Tensor]:
        """HF name -> the tensor this rank stores for it (its TP shard), each storage once: what a
        planned sync (:mod:`rlctl.reshard`, layout ``hf_tp``) fills in place."""
        return dict(self.model.named_parameters())

    @torch.no_grad()
    def update_weights(self, stream: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy ``(HF name, tensor)`` pairs into the model in place; returns how many were taken.

        Tied parameters share storage, so either name updates both. A DTensor is gathered first
        (a collective: every rank of its mesh must stream it). Under TP each tensor is this rank's
        shard (the planned sync hands back the engine's own tensors, filled: nothing to copy).
        """
        params = self._named_tensors()
        count = 0
        for name, tensor in stream:
            target = params.get(name)
            if target is None:
                raise RunError(f"update_weights: the rollout model has no parameter {name!r}")
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            if tensor is target or (tensor.data_ptr() == target.data_ptr() and tensor.shape == target.shape):
                count += 1
                continue
            if tuple(tensor.shape) != tuple(target.shape):
                raise RunError(
                    f"update_weights: {name!r} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
                )
            target.copy_(tensor.to(device=target.device, dtype=target.dtype))
            count += 1
        return count

    @torch.no_grad()
    def apply_deltas(self, deltas: Iterable[TensorDelta]) -> list[str]:
        """Write delta pushes (:mod:`rlctl.engines.weight_delta`) into the stored tensors in place;
        returns the names whose read-back disagrees with what the sender meant (empty: all landed).
        Whole tensors only: a tensor-parallel engine takes full pushes."""
        if self.tp > 1:
            raise RunError("apply_deltas: a tensor-parallel HF engine takes full weight pushes only")
        params = self._named_tensors()
        bad = []
        for delta in deltas:
            target = params.get(delta.name)
            if target is None:
                raise RunError(f"apply_deltas: the rollout model has no parameter {delta.name!r}")
            if not apply(target, delta):
                bad.append(delta.name)
        return bad

    def weight_fingerprint(
        self, spec: Sequence[tuple[str, tuple[int, ...]]], salt: int = 0
    ) -> dict[str, tuple[float, float, str] | None]:
        """Fingerprints (:mod:`rlctl.engines.fingerprint`) of the HF-named tensors in ``spec`` at
        the positions of ``salt``, read from the model's own parameters; None for a name the model
        lacks or holds in another shape."""
        if self.tp > 1:  # each rank reads its shards; the TP group adds them up (a collective)
            params = dict(self.model.named_parameters(remove_duplicate=False))
            return fingerprint_sharded(spec, params, self.tp_splits, self.tp_group, salt)
        params = self._named_tensors()
        return fingerprint_views(spec, lambda name, shape: params.get(name), salt)

    def log_prob_gap(self, *, temperature: float, top_p: float, top_k: int) -> str | None:
        """Always exact: ``rollout_log_probs`` are ``log_softmax(logits / T)`` before truncation."""
        return None

    def sleep(self) -> None:
        """Free memory while training runs: weights go to CPU and the device cache is emptied.

        On CPU there is nothing to move: the KV cache lives only inside ``generate``; this marks
        the engine asleep so a stray ``generate`` fails loudly.
        """
        accel = _accel(self.device)
        if accel is not None:
            self.model.to("cpu")
            if hasattr(accel, "empty_cache"):
                accel.empty_cache()
        self.asleep = True

    def wake(self) -> None:
        """Bring the weights back to the engine's device."""
        if _accel(self.device) is not None:
            self.model.to(self.device)
        self.asleep = False
