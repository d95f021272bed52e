"""Loading an HF checkpoint into an FSDP2-sharded model without a full host copy per rank.

Every rank builds the model with its parameters on the meta device (buffers real: non-persistent
buffers such as rotary ``inv_freq`` are computed in ``__init__`` and are in no checkpoint), shards
it with ``fully_shard``, materialises only its own shards (``to_empty``) and fills them:

* safetensors checkpoints (``model.safetensors`` or a ``model.safetensors.index.json`` set): each
  rank reads only the dim-0 rows of its shard (FSDP2 cuts dim 0 with ``torch.chunk`` semantics, so
  trailing shards may be short or empty) with plain file reads into its shard, so per-rank host
  memory stays near one shard (a memory map, as ``safe_open`` uses, would add the pages it touches
  to the rank's resident set);
* anything else (``pytorch_model.bin``): rank 0 loads the model once and FSDP2's
  ``set_model_state_dict(..., broadcast_from_rank0=True)`` sends each rank its shards (one host
  copy in the job instead of one per rank).

The parameters come out bit-identical to ``from_pretrained`` followed by ``fully_shard``: the same
tensors cast with ``.to(dtype)``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from rlctl.engines.hf_model import (
    ValueHeadModel,
    _check_path,
    load_causal_lm,
    load_value_model,
    new_value_head,
    resolve_dtype,
)
from rlctl.engines.lora import base_name, has_adapter, is_adapter
from rlctl.errors import UserError

SAFE_SINGLE = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device; buffers stay real on CPU.

    The idea of accelerate's ``init_empty_weights(include_buffers=False)``: wrap
    ``nn.Module.register_parameter`` so each parameter moves to meta as it is registered (its CPU
    ``torch.empty`` is never written, so it costs no resident memory) while buffers computed in
    ``__init__`` keep their real values.
    """
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def build_meta_model(
    model_path: str | Path,
    *,
    dtype: str | torch.dtype,
    trust_remote_code: bool,
    attn_implementation: str,
    value_head: bool,
) -> nn.Module:
    """The model of ``model_path``'s config with meta parameters and real buffers."""
    import transformers
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    path = _check_path(model_path)
    config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    factory = AutoModel if value_head else AutoModelForCausalLM
    # ``_from_config`` reads ``dtype`` on transformers 5.x; 4.x reads ``torch_dtype`` and passes any
    # other keyword on to the model's ``__init__`` (transformers/modeling_utils.py, ``_from_config``)
    dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    with params_on_meta():
        model = factory.from_config(
            config,
            trust_remote_code=trust_remote_code,
            attn_implementation=attn_implementation,
            **{dtype_key: resolve_dtype(dtype)},
        )
        if value_head:
            model = ValueHeadModel(model, model.config.hidden_size)
    return model


def checkpoint_kind(model_path: str | Path) -> str:
    """``"safetensors"`` when the weights are safetensors files, else ``"other"``."""
    path = Path(model_path)
    return "safetensors" if (path / SAFE_INDEX).is_file() or (path / SAFE_SINGLE).is_file() else "other"


# safetensors dtype tags (https://github.com/huggingface/safetensors, format docs: "Dtype")
_ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


class SafetensorsRows:
    """Read dim-0 row ranges of named tensors from one safetensors file or an indexed set.

    The format is an 8-byte little-endian header length, a JSON header (``dtype``, ``shape``,
    ``data_offsets`` per tensor) and the row-major data. Rows are read with ``readinto`` straight
    into the destination, not through a memory map, so the bytes of the file a rank reads do not
    count as its resident memory and only its own rows are read at all.
    """

    def __init__(self, model_path: str | Path):
        path = Path(model_path)
        if (path / SAFE_INDEX).is_file():
            weight_map = json.loads((path / SAFE_INDEX).read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        else:
            files = [SAFE_SINGLE]
        self.path = path
        self._entries: dict[str, tuple[Path, int, torch.dtype, tuple[int, ...]]] = {}
        for name in files:
            file = path / name
            with file.open("rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size))
            header.pop("__metadata__", None)
            for key, meta in header.items():
                if meta["dtype"] not in _ST_DTYPES:
                    raise UserError(
                        f"{str(file)!r}: tensor {key!r} has dtype {meta['dtype']!r}, not supported"
                    )
                begin = 8 + size + int(meta["data_offsets"][0])
                self._entries[key] = (file, begin, _ST_DTYPES[meta["dtype"]], tuple(meta["shape"]))

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def shape(self, key: str) -> tuple[int, ...]:
        return self._entries[key][3]

    def dtype(self, key: str) -> torch.dtype:
        return self._entries[key][2]

    def read_rows_into(self, key: str, start: int, out: torch.Tensor) -> None:
        """Fill contiguous CPU ``out`` (the file's dtype) with rows ``start..start+len(out)`` of ``key``."""
        file, begin, dtype, shape = self._entries[key]
        if out.dtype != dtype or not out.is_contiguous() or out.device.type != "cpu":
            raise ValueError("read_rows_into needs a contiguous CPU tensor of the file's dtype")
        if out.numel() == 0:
            return
        row_bytes = out[0].numel() * out.element_size() if out.dim() else out.element_size()
        with file.open("rb", buffering=0) as f:
            f.seek(begin + start * row_bytes)
            view = memoryview(out.view(-1).view(torch.uint8).numpy())
            done = 0
            while done < len(view):
                n = f.readinto(view[done:])
                if not n:
                    raise UserError(f"{str(file)!r}: tensor {key!r} is truncated")
                done += n

    def rows(self, key: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` of ``key`` (the whole tensor for a 0-dim one) as a new CPU tensor."""
        _, _, dtype, shape = self._entries[key]
        out = torch.empty((stop - start, *shape[1:]) if shape else (), dtype=dtype)
        self.read_rows_into(key, start, out)
        return out

    def full(self, key: str) -> torch.Tensor:
        shape = self.shape(key)
        return self.rows(key, 0, shape[0] if shape else 0)


def dim0_range(param: torch.Tensor) -> tuple[int, int]:
    """Global rows ``[start, stop)`` this rank holds of an FSDP2 parameter (``torch.chunk`` on dim 0)."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(param, DTensor):
        return 0, param.shape[0] if param.dim() else 0
    if param.device_mesh.ndim != 1 or tuple(param.placements) != (Shard(0),):
        raise UserError(f"sharded loading expects FSDP2's 1-D Shard(0) parameters, got {param.placements}")
    n, world = param.shape[0], param.device_mesh.size()
    chunk = -(-n // world)
    start = min(param.device_mesh.get_local_rank() * chunk, n)
    return start, min(start + chunk, n)


def _file_keys(name: str, prefix: str) -> list[str]:
    """Checkpoint keys a module parameter may be stored under (with/without the base-model prefix)."""
    keys = [name]
    if prefix:
        keys += [f"{prefix}.{name}", name.removeprefix(f"{prefix}.")]
    return keys


def _aliases(model: nn.Module) -> dict[int, list[str]]:
    """Every name of each parameter, tied ones included (``lm_head.weight`` / ``embed_tokens.weight``)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(base_name(name))  # a LoRA-injected layer's own weight too
    return names


def _value_head_state(model_path: Path, model: ValueHeadModel, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``value_head.pt`` when the directory has one, else a fresh head drawn as the eager path draws it."""
    head = model_path / "value_head.pt"
    if head.is_file():
        state = torch.load(head, map_location="cpu", weights_only=True)
    else:
        with torch.device("cpu"):
            state = new_value_head(model.config.hidden_size, dtype).state_dict()
    return {f"value_head.{k}": v for k, v in state.items()}


def fill_from_safetensors(model: nn.Module, model_path: str | Path, dtype: torch.dtype) -> None:
    """Copy each rank's own rows of every parameter (and persistent buffer) from the checkpoint."""
    path = Path(model_path)
    reader = SafetensorsRows(path)
    extra: dict[str, torch.Tensor] = {}
    if isinstance(model, ValueHeadModel):
        extra = _value_head_state(path, model, dtype)
        prefix = getattr(model.backbone, "base_model_prefix", "") or ""
    else:
        prefix = getattr(model, "base_model_prefix", "") or ""
    aliases = _aliases(model)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if is_adapter(name):  # in no base checkpoint: rlctl.engines.lora initialises it
                continue
            start, stop = dim0_range(param)
            local = param.to_local() if hasattr(param, "to_local") else param
            if name in extra:
                rows = extra[name][start:stop] if extra[name].dim() else extra[name]
            else:
                key = _find_key(reader, aliases[id(param)], prefix)
                if key is None:
                    raise UserError(
                        f"model path {str(path)!r}: the checkpoint has no tensor for parameter {name!r} "
                        f"(looked for {_candidates(aliases[id(param)], prefix)})"
                    )
                if reader.shape(key) != tuple(param.shape):
                    raise UserError(
                        f"model path {str(path)!r}: tensor {key!r} has shape {reader.shape(key)}, "
                        f"the model's {name!r} expects {tuple(param.shape)}"
                    )
                if local.dtype == reader.dtype(key) and local.is_contiguous() and local.device.type == "cpu":
                    reader.read_rows_into(key, start, local)  # no staging copy
                    continue
                rows = reader.rows(key, start, stop)
            local.copy_(rows.to(dtype=local.dtype))
        skip = _non_persistent(model)
        for name, buf in model.named_buffers():  # persistent buffers the checkpoint has (rare in LLMs)
            key = None if name in skip else _find_key(reader, [name], prefix)
            if key is not None:
                buf.copy_(reader.full(key).to(buf.dtype))


def _candidates(names: list[str], prefix: str) -> list[str]:
    out: list[str] = []
    for n in names:
        for k in _file_keys(n.removeprefix("backbone."), prefix):
            if k not in out:
                out.append(k)
    return out


def _find_key(reader: SafetensorsRows, names: list[str], prefix: str) -> str | None:
    return next((k for k in _candidates(names, prefix) if k in reader), None)


def _non_persistent(model: nn.Module) -> set[str]:
    out = set()
    for mod_name, mod in model.named_modules():
        for b in mod._non_persistent_buffers_set:
            out.add(f"{mod_name}.{b}" if mod_name else b)
    return out


def snapshot_buffers(model: nn.Module) -> dict[tuple[str, str], torch.Tensor]:
    return {
        (mod_name, b): t
        for mod_name, mod in model.named_modules()
        for b, t in mod._buffers.items()
        if t is not None
    }


def restore_buffers(model: nn.Module, saved: dict[tuple[str, str], torch.Tensor], device) -> None:
    """``to_empty`` wiped the buffers too; put back what ``__init__`` computed, on ``device``."""
    modules = dict(model.named_modules())
    for (mod_name, b), t in saved.items():
        modules[mod_name]._buffers[b] = t.to(device)


def load_sharded(
    model_path: str | Path,
    *,
    dtype: str | torch.dtype,
    trust_remote_code: bool,
    attn_implementation: str,
    value_head: bool,
    device: torch.device,
    param_device: torch.device,
    prepare: Callable[[nn.Module], None],
    shard: Callable[[nn.Module], None],
) -> nn.Module:
    """Meta construction, ``shard(model)``, ``to_empty(param_device)``, then each rank's rows.

    ``prepare`` runs on the meta model before sharding (activation checkpointing);
    ``param_device`` is where the sharded parameters live (CPU under CPU offload), ``device``
    where buffers go (the compute device).
    """
    torch_dtype = resolve_dtype(dtype)
    kind = checkpoint_kind(model_path)
    full: dict[str, torch.Tensor] = {}
    if kind != "safetensors" and dist.get_rank() == 0:
        loader = load_value_model if value_head else load_causal_lm
        eager = loader(
            model_path,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            attn_implementation=attn_implementation,
        )
        full = eager.state_dict()
        del eager
    model = build_meta_model(
        model_path,
        dtype=dtype,
        trust_remote_code=trust_remote_code,
        attn_implementation=attn_implementation,
        value_head=value_head,
    )
    prepare(model)
    buffers = snapshot_buffers(model)
    shard(model)
    model.to_empty(device=param_device)
    restore_buffers(model, buffers, device)
    if kind == "safetensors":
        fill_from_safetensors(model, model_path, torch_dtype)
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        adapter = has_adapter(model)
        if adapter and full:  # the injected model's names; the adapter is initialised afterwards
            full = {n: full[base_name(n)] for n in model.state_dict() if not is_adapter(n)}
        set_model_state_dict(
            model,
            full,
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=not adapter),
        )
    return model
