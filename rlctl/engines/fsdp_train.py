"""FSDP2 training engine: log-probs, values and optimiser steps of an HF causal LM.

When ``torch.distributed`` is initialised the model is sharded with
``torch.distributed.fsdp.fully_shard`` over a 1-D DeviceMesh (every decoder layer, then the root)
and each rank loads only its own shards (:mod:`rlctl.engines.fsdp_load`); otherwise it runs as a
plain module, so the same code serves tests, CPU runs and GPUs. ``dtype`` is the storage dtype
(parameters, gradients, AdamW state), ``mixed_precision`` the compute dtype
(:mod:`rlctl.engines.mixed_precision`).
The engine knows nothing of RL: :meth:`FSDPTrainEngine.train_batch` takes the loss function.

Batch convention (verl's): ``input_ids``/``attention_mask``/``position_ids`` (B, P+R) are a
left-padded prompt followed by a right-padded response, ``responses``/``response_mask`` (B, R).
The log-prob of response token t comes from the logits at position P-1+t. The forwards themselves
run packed, one row per prompt group with no padding between responses
(:mod:`rlctl.engines.packing`), where the model's attention allows it; else each distinct prompt
once with the responses on its KV cache (:mod:`rlctl.engines.prefix`); else verl's rows as given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from rlctl.algorithms.metric_parts import MetricPart, results
from rlctl.engines import fsdp_io
from rlctl.engines import lora as lora_lib
from rlctl.engines.batch_metrics import BatchMetrics
from rlctl.engines.fsdp_forward import TrainForwards
from rlctl.engines.fsdp_load import load_sharded
from rlctl.engines.fsdp_shard import _shard, enable_activation_checkpointing
from rlctl.engines.hf_model import load_causal_lm, load_value_model, supports_logits_to_keep
from rlctl.engines.lora import LoraSpec
from rlctl.engines.mixed_precision import DynamicLossScaler, autocast, compute_dtype
from rlctl.engines.optim import LossScale, OptimConfig, build_optimizer
from rlctl.engines.packing import can_pack
from rlctl.engines.prefix import length_dependent_rope
from rlctl.engines.registry import register_engine
from rlctl.engines.skip_rows import measure_skipped, skipped_rows, skipped_share, trained_rows
from rlctl.errors import RunError, UserError

Batch = dict[str, torch.Tensor]
LossFn = Callable[
    [dict[str, torch.Tensor], Batch, LossScale], tuple[torch.Tensor, dict[str, MetricPart | float]]
]


def split_batch(batch: Batch, micro_batch_size: int) -> list[Batch]:
    """Row-wise micro-batches of every tensor in ``batch`` (the last one may be smaller)."""
    n = next(iter(batch.values())).shape[0]
    return [{k: v[i : i + micro_batch_size] for k, v in batch.items()} for i in range(0, n, micro_batch_size)]


@register_engine("train", model_type="*", backend="fsdp2", device="*")
class FSDPTrainEngine(TrainForwards):
    """Training engine over one HF model (actor, reference or critic with ``value_head=True``)."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        mixed_precision: str | None = None,
        trust_remote_code: bool = False,
        value_head: bool = False,
        activation_checkpointing: bool = False,
        cpu_offload: bool = False,
        attn_implementation: str = "sdpa",
        optim: OptimConfig | None = None,
        micro_batch_size: int = 4,
        micro_batch_tokens: int = 0,
        share_prefix: bool = True,
        pack_sequences: bool = True,
        mesh=None,
        tokenizer=None,
        lora: LoraSpec | None = None,
    ):
        if micro_batch_size < 1 or micro_batch_tokens < 0:
            raise UserError(
                f"micro_batch_size={micro_batch_size} must be >= 1 and micro_batch_tokens="
                f"{micro_batch_tokens} >= 0"
            )
        self.model_path = Path(model_path)
        self.device = torch.device(device)
        self.micro_batch_size = micro_batch_size
        self.micro_batch_tokens = micro_batch_tokens
        # HF drops the KV cache of a checkpointed layer, so shared prompts need checkpointing off
        self.share_prefix = share_prefix and not activation_checkpointing
        self.value_head = value_head
        self.mixed_precision = mixed_precision
        self.compute_dtype = compute_dtype(dtype, mixed_precision)
        self.cpu_offload = cpu_offload
        self.tokenizer = tokenizer
        if lora is not None and value_head:
            raise UserError("LoRA ([actor.lora]) trains the actor only; a value model trains in full")
        self.lora = lora
        self.distributed = dist.is_available() and dist.is_initialized()
        load_kwargs = dict(
            dtype=dtype, trust_remote_code=trust_remote_code, attn_implementation=attn_implementation
        )
        if self.distributed:
            if mesh is None:
                from torch.distributed.device_mesh import init_device_mesh

                mesh = init_device_mesh(self.device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))
            offload = cpu_offload and self.device.type != "cpu"

            def prepare(m: nn.Module) -> None:
                if lora is not None:
                    lora_lib.inject(m, lora, on_meta=True)
                if activation_checkpointing:
                    enable_activation_checkpointing(m, value_head)

            model = load_sharded(
                model_path,
                **load_kwargs,
                value_head=value_head,
                device=self.device,
                param_device=torch.device("cpu") if offload else self.device,
                prepare=prepare,
                shard=lambda m: _shard(m, mesh, self.compute_dtype, cpu_offload, self.device.type),
            )
        else:
            model = (load_value_model if value_head else load_causal_lm)(model_path, **load_kwargs)
            if lora is not None:
                lora_lib.inject(model, lora)
            if activation_checkpointing:
                enable_activation_checkpointing(model, value_head)
            model.to(self.device)
        if lora is not None:  # the same starting adapter at every world size
            lora_lib.init_adapter(model, lora.seed)
            lora_lib.copy_saved_modules(model)
        self.arch_name = type(model).__name__.removeprefix("FSDP")
        self.share_prefix = self.share_prefix and not length_dependent_rope(model.config)  # dynamic RoPE
        self.mesh = mesh
        self.model = model
        self._keep_logits = not value_head and supports_logits_to_keep(model)
        self.pack = pack_sequences and can_pack(model)
        self.optim_config = optim or OptimConfig()
        self.optimizer, self.scheduler = build_optimizer(
            [p for p in model.parameters() if p.requires_grad], self.optim_config
        )
        self.global_step = 0
        self.metric_parts: dict[str, MetricPart] = {}  # the last train_batch's, over all ranks
        # fp16 compute underflows small gradients without a loss scale; bf16 needs none
        self.loss_scaler = DynamicLossScaler() if self.compute_dtype == torch.float16 else None

    # -- shape of the data-parallel world ---------------------------------------------------------
    @property
    def dp_size(self) -> int:
        return self.mesh.size() if self.mesh is not None else 1

    @property
    def dp_rank(self) -> int:
        return self.mesh.get_local_rank() if self.mesh is not None else 0

    def _group(self):
        return self.mesh.get_group() if self.mesh is not None else None

    def _set_training(self, training: bool) -> None:
        """``model.train(training)`` only when the mode changes: transformers' ``train()`` re-walks
        every module and re-registers its kernel mappings (about 2 ms per call on a 4-layer model)."""
        if self.model.training != training:
            self.model.train(training)

    def _autocast(self):
        return autocast(self.device, self.compute_dtype, self.distributed)

    @torch.no_grad()
    def compute_log_prob(
        self,
        batch: Batch,
        temperature: float = 1.0,
        with_entropy: bool = False,
        micro_batch_size: int | None = None,
    ) -> dict[str, torch.Tensor]:
        """Per-token log-probs (B, R) of ``responses`` (and entropy) under ``temperature``; no grad.

        ``micro_batch_size`` overrides the engine's for this call (inference can take bigger ones).
        """
        if self.value_head:
            raise UserError(
                "compute_log_prob needs a causal LM engine; this one was built with value_head=True"
            )
        self._set_training(False)
        outs = [
            self._forward(mb, temperature=temperature, with_entropy=with_entropy)
            for mb in self._split(batch, "compute_log_prob", micro_batch_size)
        ]
        self._reshard()
        return {k: torch.cat([o[k] for o in outs]).cpu() for k in outs[0]}

    def compute_base_log_prob(
        self, batch: Batch, temperature: float = 1.0, micro_batch_size: int | None = None
    ) -> dict[str, torch.Tensor]:
        """Log-probs with the LoRA adapter switched off: the reference policy, no second copy."""
        with lora_lib.adapter_disabled(self.model):
            return self.compute_log_prob(batch, temperature=temperature, micro_batch_size=micro_batch_size)

    @torch.no_grad()
    def compute_values(self, batch: Batch, micro_batch_size: int | None = None) -> torch.Tensor:
        """Critic values (B, R) aligned with the response tokens (position P-1+t)."""
        if not self.value_head:
            raise UserError("compute_values needs an engine built with value_head=True")
        self._set_training(False)
        outs = [
            self._forward(mb, temperature=1.0, with_entropy=False)
            for mb in self._split(batch, "compute_values", micro_batch_size)
        ]
        self._reshard()
        return torch.cat([o["values"] for o in outs]).cpu()

    # -- training -----------------------------------------------------------------------------------
    def _loss_scale(self, batch: Batch) -> LossScale:
        # sequences with at least one valid token: the set agg_loss's seq-mean modes average over,
        # so fully masked rows (padding that only makes shapes divide) count nowhere
        mask = batch["response_mask"]
        totals = torch.tensor([float(mask.sum()), float((mask.sum(-1) > 0).sum())], dtype=torch.float64)
        if self.distributed:
            totals = totals.to(self.device)
            dist.all_reduce(totals, group=self._group())
        return LossScale(global_tokens=int(totals[0]), global_seqs=int(totals[1]), dp_size=self.dp_size)

    def _reshard(self) -> None:
        """FSDP2 keeps the root's parameters unsharded after a forward without backward; put them
        back so memory is freed and ``parameters()`` are the fp32 DTensor shards again."""
        if self.distributed and hasattr(self.model, "reshard"):
            self.model.reshard()

    def _split(
        self,
        batch: Batch,
        what: str,
        micro_batch_size: int | None = None,
        fill: Batch | None = None,
        at_least: int = 1,
    ) -> list[Batch]:
        """Micro-batches; under FSDP every rank must run the same number (each forward is a
        collective), so a mismatch is a RunError instead of a hang. With ``fill`` (a row that adds
        nothing) ranks with fewer run it until the counts agree, and at least ``at_least`` times,
        so gradients are zeros where nothing is trained (AdamW then steps as it would on the full
        batch)."""
        parts = split_batch(batch, micro_batch_size or self.rows_per_micro_batch(batch))
        most = len(parts)
        if self.distributed:
            counts = torch.tensor([len(parts), -len(parts)], device=self.device)
            dist.all_reduce(counts, op=dist.ReduceOp.MAX, group=self._group())
            most = int(counts[0])
            if fill is None and most != -int(counts[1]):
                raise RunError(
                    f"{what} on rank {dist.get_rank()}: ranks hold between {-int(counts[1])} and "
                    f"{int(counts[0])} micro-batches; pad the batch so every DP rank gets the same size"
                )
        if fill is not None:
            parts += [fill] * (max(at_least, most) - len(parts))
        return parts

    def rows_per_micro_batch(self, batch: Batch) -> int:
        """The sequence count, or under a token budget as many rows as fit at the batch's padded
        width (at least one). Every DP rank holds the same width and row count (the driver's
        layout), so every rank cuts the same number of micro-batches."""
        if self.micro_batch_tokens <= 0:
            return self.micro_batch_size
        return max(1, self.micro_batch_tokens // max(1, batch["input_ids"].shape[1]))

    def train_batch(
        self,
        batch: Batch,
        loss_fn: LossFn,
        *,
        temperature: float = 1.0,
        with_entropy: bool = True,
        step_schedule: bool = True,
        skip_rows: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """One optimiser step over a mini-batch, accumulating gradients over micro-batches.

        ``loss_fn(outputs, micro_batch, scale)`` returns this micro-batch's share of the
        mini-batch loss (see :class:`LossScale`) and its metrics, as parts
        (:mod:`rlctl.algorithms.metric_parts`; reported as the mini-batch's, kept in
        ``metric_parts``) or plain floats (averaged over micro-batches); backward runs on the
        share unscaled (times the loss scale under fp16 compute). Then gradients are clipped
        (``grad_norm`` is the norm before clipping), AdamW steps, and the LR schedule too unless
        ``step_schedule=False`` (the caller then calls :meth:`advance_schedule` once per RL step).
        A non-finite grad norm skips the update and reports ``skipped=1``.

        ``skip_rows`` (bool per row) marks rows the caller knows add exactly nothing to the loss
        or its gradient (:func:`rlctl.engines.skip_rows.trained_rows`): they count in the loss's
        totals but are not forwarded; ``zero_grad_row_frac`` reports their fraction,
        ``forwarded_token_frac`` the share of the batch's real tokens the forwards computed (fill
        rows included; what ``bench step`` counts as the update's FLOPs). The loss's metrics
        stay the whole batch's: the skipped rows run a forward without grad for them
        (``metrics_token_frac``: its share of the batch's tokens; :mod:`rlctl.engines.skip_rows`).
        """
        self._set_training(True)
        scale = self._loss_scale(batch)
        self.optimizer.zero_grad(set_to_none=True)
        parts = BatchMetrics()
        parts.add({"zero_grad_row_frac": skipped_share(batch, skip_rows)})
        trained, fill = trained_rows(batch, skip_rows)
        skipped = skipped_rows(batch, skip_rows)
        measured = 0.0
        if skipped is not None:  # every rank alike: the rule that marks rows is the same everywhere
            micro = self._split(skipped, "train_batch metrics", fill=fill, at_least=0)
            measured = measure_skipped(
                micro, self._forward, loss_fn, scale, parts, self.device, temperature, with_entropy
            )
            self._reshard()
        forwarded = 0.0
        for mb in self._split(trained, "train_batch", fill=fill):
            forwarded += float(mb["attention_mask"].sum())
            outputs = self._forward(mb, temperature=temperature, with_entropy=with_entropy)
            loss, metrics = loss_fn(outputs, {k: v.to(self.device) for k, v in mb.items()}, scale)
            (loss * self.loss_scaler.scale if self.loss_scaler else loss).backward()
            parts.add(metrics)
        # the mini-batch's metrics over every micro-batch and rank (rlctl.engines.batch_metrics)
        self.metric_parts = parts.reduce(self._group() if self.distributed else None, self.device)
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.loss_scaler:
            self.loss_scaler.unscale_(params)
        clip = self.optim_config.grad_clip if self.optim_config.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        grad_norm = float(grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        skipped = not torch.isfinite(torch.tensor(grad_norm))
        if skipped:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
            if step_schedule:
                self.scheduler.step()
            self.global_step += 1
        out = results(self.metric_parts)
        out.update(grad_norm=grad_norm, lr=lr, skipped=float(skipped))
        out["forwarded_token_frac"] = forwarded / max(1.0, float(batch["attention_mask"].sum()))
        out["metrics_token_frac"] = measured / max(1.0, float(batch["attention_mask"].sum()))
        if self.loss_scaler:
            out["loss_scale"] = self.loss_scaler.scale
            self.loss_scaler.update(found_inf=skipped)
        return out

    def advance_schedule(self) -> None:
        """One LR-schedule step (for callers that train with ``step_schedule=False``)."""
        self.scheduler.step()

    # -- weights, checkpoints, memory ---------------------------------------------------------------
    def export_weights(
        self, mode: str = "full", dtype: torch.dtype | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Stream ``(HF name, tensor)``: ``full`` gathers one parameter at a time; ``sharded``
        yields each parameter as it is stored (a DTensor whose ``to_local()`` is this rank's shard)."""
        self._reshard()
        return fsdp_io.export_weights(self.model, mode=mode, dtype=dtype)

    def export_adapter(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Stream the full trainable tensors (LoRA adapter, ``modules_to_save``), one gather each."""
        self._reshard()
        return fsdp_io.export_weights(self.model, mode="full", only_trainable=True)

    def lora_metrics(self) -> dict[str, float]:
        """``lora/trainable_params`` and ``lora/adapter_norm`` (L2 over every trainable tensor)."""
        return fsdp_io.trainable_metrics(self.model, self._group() if self.distributed else None)

    def state_dict_for_checkpoint(self) -> dict:
        """Sharded model + optimizer state dicts (DCP layout) of this rank."""
        return fsdp_io.checkpoint_state(self.model, self.optimizer)

    def save_checkpoint(self, path: str | Path) -> None:
        """Sharded checkpoint (torch.distributed.checkpoint) of model, optimizer and schedule."""
        fsdp_io.save_checkpoint(self, Path(path))

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore what :meth:`save_checkpoint` wrote; training resumes bit-exact."""
        fsdp_io.load_checkpoint(self, Path(path))

    def save_hf(self, path: str | Path, tokenizer=None) -> None:
        """``save_pretrained`` layout loadable by transformers (rank 0 writes), tokenizer included."""
        fsdp_io.save_hf(self, Path(path), tokenizer or self.tokenizer)

    def offload(self) -> None:
        """Move parameters and optimizer state to CPU (no-op when the engine already runs on CPU)."""
        fsdp_io.move_engine(self, torch.device("cpu"))

    def onload(self) -> None:
        """Bring parameters and optimizer state back to the engine's device."""
        fsdp_io.move_engine(self, self.device)
