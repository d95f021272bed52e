"""Weight export, sharded checkpoints, HF export and memory moves of the FSDP2 training engine."""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from rlctl.devices import runtime_of
from rlctl.engines.disk_space import save_failure, state_bytes
from rlctl.engines.lora import has_adapter
from rlctl.engines.safe_checkpoint import SafeLoadPlanner, check_dcp_metadata, safe_torch_load
from rlctl.errors import DiskFullError, RunError, UserError


class TrainEngineState(Protocol):
    """What these functions read and set on the training engine (``fsdp_train.FSDPTrainEngine``),
    named here so this module needs no import of it (the engine calls into this one)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    global_step: int
    loss_scaler: Any
    value_head: bool
    arch_name: str | None
    model_path: Path
    device: torch.device


EXTRA_STATE = "rlctl_engine_state.pt"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "added_tokens.json",
)


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def export_weights(
    model: nn.Module, mode: str = "full", dtype: torch.dtype | None = None, only_trainable: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """One ``(name, tensor)`` per parameter; tied weights appear once (under their first name).

    ``full``: each DTensor is all-gathered on its own, so peak memory is one full parameter, never
    the whole model (every rank must iterate, the gathers are collective).
    ``sharded``: the stored parameter itself, a DTensor carrying mesh and placements.
    """
    if mode not in ("full", "sharded"):
        raise UserError(f"export_weights mode={mode!r}; expected 'full' or 'sharded'")
    for name, param in model.named_parameters():
        if only_trainable and not param.requires_grad:
            continue
        tensor = param.detach()
        if mode == "full" and hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        if dtype is not None:
            tensor = tensor.to(dtype)
        yield name, tensor


def checkpoint_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """``{"model": ..., "optim": ...}`` sharded state dicts (DTensors under FSDP2)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer, options=_state_options(model))
    if has_adapter(model):  # a frozen weight tied to another (lm_head) slips past ignore_frozen_params
        trained = {n for n, p in model.named_parameters() if p.requires_grad}
        model_sd = {k: v for k, v in model_sd.items() if k in trained}
    return {"model": model_sd, "optim": optim_sd}


def _state_options(model: nn.Module):
    """With a LoRA adapter, checkpoints hold the trainable tensors only (the base is the model path's)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    if not has_adapter(model):
        return None
    return StateDictOptions(ignore_frozen_params=True, strict=False)


def trainable_metrics(model: nn.Module, group=None) -> dict[str, float]:
    """Count and global L2 norm of the trainable parameters (FSDP shards: summed over ranks)."""
    params = [p for p in model.parameters() if p.requires_grad]
    squares = sum(
        (p.to_local() if hasattr(p, "to_local") else p).detach().double().pow(2).sum() for p in params
    )
    squares = torch.as_tensor(squares, dtype=torch.float64).reshape(1)
    if group is not None or (dist.is_available() and dist.is_initialized()):
        device = params[0].device if params else torch.device("cpu")
        squares = squares.to(device)
        dist.all_reduce(squares, group=group)
    return {
        "lora/trainable_params": float(sum(p.numel() for p in params)),
        "lora/adapter_norm": float(squares.sqrt()),
    }


def save_checkpoint(engine: TrainEngineState, path: Path) -> None:
    """DCP save of model + optimizer; scheduler and step go in a small file written by rank 0.

    A failure is one line naming ``path`` and the rank (DCP's ``CheckpointException`` unwrapped);
    a full disk is a DiskFullError with the bytes this state needs and the bytes free.
    """
    import torch.distributed.checkpoint as dcp

    path.mkdir(parents=True, exist_ok=True)
    state = checkpoint_state(engine.model, engine.optimizer)
    try:
        with warnings.catch_warnings():  # one process without torch.distributed is a supported case
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            dcp.save(state, checkpoint_id=str(path))
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        if not (isinstance(exc, Exception) or type(exc).__name__ == "CheckpointException"):
            raise  # KeyboardInterrupt, SystemExit
        raise save_failure(path, exc, state_bytes(state), _rank()) from None
    failed = ""
    if _rank() == 0:
        extra = {"scheduler": engine.scheduler.state_dict(), "global_step": engine.global_step}
        if engine.loss_scaler is not None:
            extra["loss_scaler"] = engine.loss_scaler.state_dict()
        try:
            with open(path / EXTRA_STATE, "wb") as f:  # a Python file: ENOSPC keeps its errno
                torch.save(extra, f)
        except Exception as exc:
            error = save_failure(path, exc, state_bytes(state), 0)
            failed = f"{type(error).__name__}: {error}"
    failed = _from_rank0(failed)  # every rank fails together, none waits in a barrier for rank 0
    if failed:
        kind, _, message = failed.partition(": ")
        raise (DiskFullError if kind == "DiskFullError" else RunError)(message)
    _barrier()


def _from_rank0(value: str) -> str:
    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def load_checkpoint(engine: TrainEngineState, path: Path) -> None:
    """DCP load into the current (sharded) model and optimizer, then the schedule and step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    if not (path / EXTRA_STATE).is_file():
        raise UserError(
            f"checkpoint {str(path)!r} has no {EXTRA_STATE}; expected a directory from save_checkpoint"
        )
    check_dcp_metadata(path)  # before DCP unpickles it
    state = checkpoint_state(engine.model, engine.optimizer)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            dcp.load(state, checkpoint_id=str(path), planner=SafeLoadPlanner())
    except UserError:
        raise
    except Exception as exc:
        raise RunError(f"loading checkpoint {str(path)!r} on rank {_rank()} failed: {exc}") from exc
    set_state_dict(
        engine.model,
        engine.optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=_state_options(engine.model),
    )
    extra = safe_torch_load(path / EXTRA_STATE)
    engine.scheduler.load_state_dict(extra["scheduler"])
    engine.global_step = int(extra["global_step"])
    if engine.loss_scaler is not None and "loss_scaler" in extra:
        engine.loss_scaler.load_state_dict(extra["loss_scaler"])


def _full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict on rank 0 (CPU), empty elsewhere; plain ``state_dict`` when unsharded."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not (dist.is_available() and dist.is_initialized()):
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_hf(engine: TrainEngineState, path: Path, tokenizer=None) -> None:
    """Write a ``save_pretrained`` directory; a critic also writes ``value_head.pt``; a LoRA actor
    writes peft's adapter directory (and ``merged/`` when its spec asks, :mod:`.lora_export`)."""
    state = _full_state_dict(engine.model)
    if getattr(engine, "lora", None) is not None:
        from rlctl.engines.lora_export import save_lora

        if _rank() == 0:
            save_lora(engine, state, path, tokenizer, TOKENIZER_FILES)
        _barrier()
        return
    if _rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
        if engine.value_head:
            backbone = {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}
            engine.model.backbone.save_pretrained(str(path), state_dict=backbone)
            head = {k.removeprefix("value_head."): v for k, v in state.items() if k.startswith("value_head.")}
            torch.save(head, path / "value_head.pt")
        else:
            engine.model.save_pretrained(str(path), state_dict=state)
        _fix_architecture(path, engine.arch_name if not engine.value_head else None)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(path))
        else:
            for name in TOKENIZER_FILES:
                if (engine.model_path / name).is_file():
                    shutil.copy2(engine.model_path / name, path / name)
    _barrier()


def _fix_architecture(path: Path, arch_name: str | None) -> None:
    """fully_shard swaps the class to ``FSDP<Name>``; write the real architecture into config.json."""
    cfg_file = path / "config.json"
    cfg = json.loads(cfg_file.read_text())
    archs = [a.removeprefix("FSDP") for a in cfg.get("architectures") or []]
    if arch_name:
        archs = [arch_name]
    cfg["architectures"] = archs
    cfg_file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def move_engine(engine: TrainEngineState, device: torch.device) -> None:
    """Move parameters, gradients and optimizer state; a no-op for a CPU engine."""
    if engine.device.type == "cpu":
        return
    engine.model.to(device)
    for state in engine.optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device, non_blocking=True)
    if device.type == "cpu":
        runtime = runtime_of(engine.device)
        runtime.synchronize()
        runtime.empty_cache()
