"""LoRA adapters through peft on the engines' models: injection, initialisation, on/off, merging.

peft's ``LoraModel`` injects its layers into the HF model in place, so the model keeps its class
and its parameter names, with two changes: an adapted projection's own weight is now
``<module>.base_layer.weight`` beside ``<module>.lora_A.default.weight`` / ``lora_B``, and a
``modules_to_save`` module holds ``original_module.*`` and its trained copy
``modules_to_save.default.*``. Training and rollout engines inject the same config, so adapter
tensors move between them under the same names; :func:`base_name` maps a name back to the
checkpoint's. Only the adapter (and ``modules_to_save``) require grad.

The adapter is initialised here, not by peft: ``lora_A`` uniform in ``+-1/sqrt(fan_in)`` (peft's
default Kaiming bound) drawn from a generator seeded by the tensor's name, ``lora_B`` zero, so
every world size starts from the same adapter and an FSDP shard fills its own rows of it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from rlctl.engines.engine_specs import LoraSpec
from rlctl.errors import UserError

ADAPTER = "default"  # peft's adapter name; the only one rlctl uses
ADAPTER_FILE = "adapter_model.safetensors"


def inject(model: nn.Module, spec: LoraSpec, *, on_meta: bool = False) -> nn.Module:
    """Add ``spec``'s adapter to ``model`` in place (peft ``LoraModel``); returns ``model``.

    ``on_meta`` creates the adapter on the meta device (a model about to be sharded and filled).
    Only adapter and ``modules_to_save`` parameters require grad afterwards.
    """
    from peft.tuners.lora import LoraModel

    where = f"actor.lora.target_modules = {list(spec.target_modules)}"
    if spec.dropout > 0:  # rlctl.profile.lora_checks says why
        raise UserError(
            f"actor.lora.dropout = {spec.dropout}: not supported (the old log-probs and the update "
            "would see different dropout); set 0"
        )
    _refuse_tied_saved(model, spec)
    try:
        LoraModel(model, spec.peft_config(), ADAPTER, low_cpu_mem_usage=on_meta)
    except ValueError as exc:  # peft: no module matched, or a module type it cannot adapt
        raise UserError(f"{where}: {str(exc).splitlines()[0]}") from None
    if not any(is_adapter(n) for n, _ in model.named_parameters()):
        raise UserError(f"{where} matched no module of {type(model).__name__}")
    from peft.tuners.lora.layer import Embedding

    embedded = [n for n, m in model.named_modules() if isinstance(m, Embedding)]
    if embedded:
        raise UserError(
            f"{where}: {embedded[0]!r} is an embedding layer; its LoRA (lora_embedding_A/B) is not "
            "merged into the merged export or a merged-weights sync: train it with "
            "actor.lora.modules_to_save, or adapt linear projections only"
        )
    return model


def _refuse_tied_saved(model: nn.Module, spec: LoraSpec) -> None:
    """UserError where ``modules_to_save`` names one half of a tied input/output embedding: its
    trained copy would sync and export as the pair (peft's wrapper fails on it, or is wrong)."""
    if not spec.modules_to_save or not getattr(model.config, "tie_word_embeddings", False):
        return
    halves = {id(model.get_input_embeddings()), id(model.get_output_embeddings())}
    for name, module in model.named_modules():
        if id(module) in halves and any(name == t or name.endswith(f".{t}") for t in spec.modules_to_save):
            raise UserError(
                f"actor.lora.modules_to_save = {list(spec.modules_to_save)}: {name!r} is one half of "
                f"{type(model).__name__}'s tied input/output embedding; a trained copy of one half "
                "cannot be synced or exported as the pair"
            )


def is_adapter(name: str) -> bool:
    """Whether a parameter name is a LoRA tensor (absent from the base checkpoint)."""
    return ".lora_" in name


def base_name(name: str) -> str:
    """The base checkpoint's name of an injected model's parameter (identity without LoRA)."""
    for part in (".base_layer", ".original_module", f".modules_to_save.{ADAPTER}"):
        name = name.replace(part, "")
    return name


def has_adapter(model: nn.Module) -> bool:
    return any(is_adapter(n) for n, _ in model.named_parameters())


def _rows(param: torch.Tensor) -> tuple[int, int]:
    """Global dim-0 rows ``[start, stop)`` of this rank's piece (all of a plain tensor); FSDP2's
    ``Shard(0)`` cuts ``torch.chunk`` sizes, as ``fsdp_load.dim0_range`` reads them."""
    if not hasattr(param, "to_local"):
        return 0, param.shape[0]
    n, world = param.shape[0], param.device_mesh.size()
    chunk = -(-n // world)
    start = min(param.device_mesh.get_local_rank() * chunk, n)
    return start, min(start + chunk, n)


def initial_value(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The adapter tensor's starting value (fp32, CPU): ``lora_A`` uniform, ``lora_B`` zero."""
    if ".lora_B" in name or ".lora_embedding_B" in name:
        return torch.zeros(shape)
    fan_in = shape[1] if len(shape) > 1 else shape[0]
    bound = 1.0 / math.sqrt(fan_in)
    g = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
    return torch.empty(shape).uniform_(-bound, bound, generator=g)


@torch.no_grad()
def init_adapter(model: nn.Module, seed: int) -> None:
    """Set every LoRA tensor to :func:`initial_value` (each FSDP rank its own rows)."""
    for name, param in model.named_parameters():
        if not is_adapter(name):
            continue
        full = initial_value(name, tuple(param.shape), seed)
        start, stop = _rows(param)
        local = param.to_local() if hasattr(param, "to_local") else param
        local.copy_(full[start:stop].to(local.dtype))


@torch.no_grad()
def copy_saved_modules(model: nn.Module) -> None:
    """``modules_to_save`` copies start as their module's checkpoint weights (filled in the
    original); the rows of both are laid out alike, so each rank copies its own."""
    params = dict(model.named_parameters())
    for name, param in params.items():
        if f".modules_to_save.{ADAPTER}." in name:
            source = params[name.replace(f".modules_to_save.{ADAPTER}.", ".original_module.")]
            dst = param.to_local() if hasattr(param, "to_local") else param
            src = source.to_local() if hasattr(source, "to_local") else source
            dst.copy_(src)


def lora_layers(model: nn.Module) -> list[nn.Module]:
    """Every module that carries adapter state: peft's LoRA layers (``BaseTunerLayer``) and its
    ``modules_to_save`` wrappers (``AuxiliaryTrainingWrapper``), the set peft's own
    ``disable_adapter()`` switches (peft 0.21, ``tuners/tuners_utils.py``,
    ``BaseTuner._enable_adapter_layers``)."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer | AuxiliaryTrainingWrapper)]


@contextmanager
def adapter_disabled(model: nn.Module) -> Iterator[None]:
    """The base model's forward (the reference policy): every adapter layer and every
    ``modules_to_save`` copy off (the original module computes), then on again. peft's wrapper
    clears its copy's ``requires_grad`` while off and sets it again when switched on."""
    layers = lora_layers(model)
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def scaling(spec: LoraSpec) -> float:
    return spec.alpha / spec.rank


def merged_state(state: dict[str, torch.Tensor], spec: LoraSpec) -> dict[str, torch.Tensor]:
    """A full state dict of the injected model -> the plain model's, adapter merged:
    ``W + B @ A * alpha / r`` under the base name; ``modules_to_save`` copies replace their module."""
    out: dict[str, torch.Tensor] = {}
    s = scaling(spec)
    for name, tensor in state.items():
        if is_adapter(name) or ".original_module." in name:
            continue
        if name.endswith(".base_layer.weight"):
            module = name.removesuffix(".base_layer.weight")
            a = state.get(f"{module}.lora_A.{ADAPTER}.weight")
            b = state.get(f"{module}.lora_B.{ADAPTER}.weight")
            if a is not None and b is not None:
                delta = (b.double() @ a.double()) * s
                tensor = (tensor.double() + delta).to(tensor.dtype)
        out[base_name(name)] = tensor
    return out


def adapter_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """peft's saved-adapter layout of a full state dict (``get_peft_model_state_dict``'s keys):
    ``base_model.model.`` + the LoRA name without the adapter name; a ``modules_to_save`` copy
    under its module's own name (peft 0.21, ``utils/other.py``, ``ModulesToSaveWrapper.adapter_state_dict``)."""
    out = {}
    for name, tensor in state.items():
        if is_adapter(name):
            out["base_model.model." + name.replace(f".{ADAPTER}", "")] = tensor.contiguous()
        elif f".modules_to_save.{ADAPTER}." in name:
            out["base_model.model." + name.replace(f".modules_to_save.{ADAPTER}", "")] = tensor.contiguous()
    return out



def shared_base_model(train_model: nn.Module, meta_model: nn.Module) -> nn.Module:
    """A rollout model whose frozen base tensors *are* the training model's (one process, same
    device and dtype): ``meta_model`` (the same class with the same adapter injected, parameters on
    meta) gets the trainer's frozen storage and copies of the trainable tensors, so the base is held
    once in the process. Tied parameters stay tied; nothing here requires grad."""
    src = dict(train_model.named_parameters())
    made: dict[int, nn.Parameter] = {}
    with torch.no_grad():
        for name, param in meta_model.named_parameters(remove_duplicate=False):
            if id(param) not in made:
                own = src[name]
                data = own.detach().clone() if own.requires_grad else own.detach()
                made[id(param)] = nn.Parameter(data, requires_grad=False)
            module_name, _, attr = name.rpartition(".")
            meta_model.get_submodule(module_name)._parameters[attr] = made[id(param)]
    return meta_model


def can_share_base(train_model: nn.Module, dtype: torch.dtype) -> bool:
    """Whether a rollout copy in ``dtype`` can use the trainer's frozen tensors as they are."""
    frozen = [p for p in train_model.parameters() if not p.requires_grad]
    return bool(frozen) and all(not hasattr(p, "to_local") and p.dtype == dtype for p in frozen)
