"""Record the vLLM / SGLang API surface rlctl touches, read from their released wheels (no import).

Developer-run, never run by the tests. For each ``package==version`` it downloads the wheel with
``pip download --no-deps`` (into ``--wheels``, outside the repository), reads the Python source
straight out of the zip with :mod:`ast` and writes ``tests/engines/surfaces/<package>-<version>.json``:
the signatures of the methods the adapters call, the field names of ``EngineArgs`` / ``ServerArgs``
/ ``SamplingParams`` (the keywords an unknown name of which raises), the log-prob modes and the
attention backends. The fakes in ``tests/engines/fakes.py`` are built from these files.

    python ci/api_surface.py vllm==0.10.2 vllm==0.13.0 vllm==0.33.0 sglang==0.5.3 sglang==0.5.23
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "engines" / "surfaces"

VLLM_LLM_METHODS = ("__init__", "generate", "sleep", "wake_up", "collective_rpc", "reset_prefix_cache")
VLLM_ENGINE_LORA_METHODS = ("add_lora", "remove_lora", "list_loras")  # LLM.llm_engine (V1 LLMEngine)
SGLANG_ENGINE_METHODS = (
    "__init__",
    "generate",
    "update_weights_from_tensor",
    "release_memory_occupation",
    "resume_memory_occupation",
    "begin_weight_update",
    "end_weight_update",
    "flush_cache",
    "shutdown",
    "load_lora_adapter",
    "unload_lora_adapter",
)


def download(spec: str, wheels: Path) -> Path:
    """``pip download --no-deps spec`` into ``wheels/<name>-<version>/``; returns the wheel."""
    name, version = spec.split("==")
    dest = wheels / f"{name}-{version}"
    found = sorted(dest.glob("*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", spec, "-d", str(dest)]
        subprocess.run(cmd, check=True)
        found = sorted(dest.glob("*.whl"))
    return found[0]


class Wheel:
    """Python sources of one wheel, parsed lazily by path inside the zip."""

    def __init__(self, path: Path):
        self.path = path
        self.zip = zipfile.ZipFile(path)
        self.names = set(self.zip.namelist())

    def tree(self, name: str) -> ast.Module | None:
        if name not in self.names:
            return None
        return ast.parse(self.zip.read(name).decode("utf-8"), filename=name)

    def find_class(self, cls: str, prefix: str) -> tuple[str, ast.ClassDef] | None:
        """The first ``class cls`` under ``prefix`` (files are searched by text first: cheap)."""
        needle = f"class {cls}".encode()
        for name in sorted(self.names):
            if name.startswith(prefix) and name.endswith(".py") and needle in self.zip.read(name):
                node = _class(self.tree(name), cls)
                if node is not None:
                    return name, node
        return None


def _class(tree: ast.Module | None, name: str) -> ast.ClassDef | None:
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict:
    """Parameter names and kinds (self dropped): what ``inspect.Signature`` needs to rebuild it."""
    a = fn.args
    params = []
    positional = a.posonlyargs + a.args
    first_default = len(positional) - len(a.defaults)
    for i, arg in enumerate(positional):
        kind = "positional_only" if i < len(a.posonlyargs) else "positional_or_keyword"
        params.append({"name": arg.arg, "kind": kind, "default": i >= first_default})
    if a.vararg:
        params.append({"name": a.vararg.arg, "kind": "var_positional", "default": False})
    for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params.append({"name": arg.arg, "kind": "keyword_only", "default": default is not None})
    if a.kwarg:
        params.append({"name": a.kwarg.arg, "kind": "var_keyword", "default": False})
    if params and params[0]["name"] in ("self", "cls"):
        params = params[1:]
    return {"params": params}


def _methods(cls: ast.ClassDef, wanted: tuple[str, ...]) -> dict:
    found = {}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in wanted:
            found[node.name] = _signature(node)
    return {name: found[name] for name in wanted if name in found}


def _annotated_fields(cls: ast.ClassDef) -> list[str]:
    """Class-level ``name: type [= default]`` (dataclass / msgspec / pydantic fields)."""
    return [
        node.target.id
        for node in cls.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.simple
        if not node.target.id.startswith("__") and not _is_classvar(node.annotation)
    ]


def _is_classvar(annotation: ast.expr) -> bool:
    text = ast.unparse(annotation)
    return text.startswith("ClassVar") or text.startswith("typing.ClassVar")


def _struct_kind(cls: ast.ClassDef) -> str:
    bases = " ".join(ast.unparse(b) for b in cls.bases)
    decorators = " ".join(ast.unparse(d) for d in cls.decorator_list)
    if "msgspec" in bases or "Struct" in bases:
        return "msgspec"
    if "dataclass" in decorators:
        return "dataclass"
    return "class"


def _enum_members(cls: ast.ClassDef) -> list[str]:
    return [
        t.id
        for node in cls.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name) and not t.id.startswith("_")
    ]


def _string_list(tree: ast.Module | None, name: str) -> list[str]:
    """A module-level ``NAME = [ "a", "b", ... ]`` as strings."""
    for node in tree.body if tree is not None else ():
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            and isinstance(node.value, ast.List | ast.Tuple)
        ):
            return [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    return []


def _literal_values(tree: ast.Module | None, name: str) -> list[str]:
    """``NAME = Literal["a", "b"]`` as a list of strings."""
    for node in tree.body if tree is not None else ():
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            and isinstance(node.value, ast.Subscript)
        ):
            sl = node.value.slice
            elts = sl.elts if isinstance(sl, ast.Tuple) else [sl]
            return [e.value for e in elts if isinstance(e, ast.Constant)]
    return []


def vllm_surface(wheel: Wheel, version: str) -> dict:
    llm = _class(wheel.tree("vllm/entrypoints/llm.py"), "LLM")
    engine_args = _class(wheel.tree("vllm/engine/arg_utils.py"), "EngineArgs")
    sampling = _class(wheel.tree("vllm/sampling_params.py"), "SamplingParams")
    modes: list[str] = []
    for path in ("vllm/config/model.py", "vllm/config/__init__.py", "vllm/config.py"):
        tree = wheel.tree(path)
        modes = _literal_values(tree, "LogprobsMode")
        enum = _class(tree, "LogprobsMode")
        if enum is not None:  # 0.10.x: an Enum whose values are the mode strings
            modes = [
                node.value.value
                for node in enum.body
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            ]
        if modes:
            break
    attention = _class(wheel.tree("vllm/config/attention.py"), "AttentionConfig")
    engine = _class(wheel.tree("vllm/v1/engine/llm_engine.py"), "LLMEngine")
    lora_request = _class(wheel.tree("vllm/lora/request.py"), "LoRARequest")
    backends = wheel.find_class("AttentionBackendEnum", "vllm/") or wheel.find_class("_Backend", "vllm/")
    return {
        "package": "vllm",
        "version": version,
        "wheel": wheel.path.name,
        "LLM": {"file": "vllm/entrypoints/llm.py", "methods": _methods(llm, VLLM_LLM_METHODS)},
        "EngineArgs": {
            "file": "vllm/engine/arg_utils.py",
            "kind": _struct_kind(engine_args),
            "fields": _annotated_fields(engine_args),
        },
        "SamplingParams": {
            "file": "vllm/sampling_params.py",
            "kind": _struct_kind(sampling),
            "fields": _annotated_fields(sampling),
        },
        "logprobs_modes": modes,
        "LLMEngine": None
        if engine is None
        else {"file": "vllm/v1/engine/llm_engine.py", "methods": _methods(engine, VLLM_ENGINE_LORA_METHODS)},
        "LoRARequest": None
        if lora_request is None
        else {
            "file": "vllm/lora/request.py",
            "kind": _struct_kind(lora_request),
            "fields": _annotated_fields(lora_request),
        },
        "AttentionConfig": None
        if attention is None
        else {"file": "vllm/config/attention.py", "fields": _annotated_fields(attention)},
        "attention_backends": {"file": backends[0], "names": _enum_members(backends[1])}
        if backends
        else None,
    }


def _sglang_server_args(wheel: Wheel) -> dict:
    """ServerArgs: one dataclass (<= 0.5.19) or msgspec namespaces assembled by defstruct (0.5.20+)."""
    path = "sglang/srt/server_args.py"
    tree = wheel.tree(path)
    cls = _class(tree, "ServerArgs")
    fields = _annotated_fields(cls)
    kind = _struct_kind(cls)
    namespaces = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in node.targets
        ):
            namespaces = [e.id for e in node.value.elts if isinstance(e, ast.Name)]
    if namespaces:  # fields live in sglang/srt/arg_groups/fields/*.py
        kind = "msgspec"
        for name in namespaces:
            found = wheel.find_class(name, "sglang/srt/arg_groups/fields/")
            if found is None:
                raise SystemExit(f"ServerArgs namespace {name} not found in {wheel.path.name}")
            fields += [f for f in _annotated_fields(found[1]) if not f.startswith("_")]
    return {"file": path, "kind": kind, "fields": fields}


def _memory_regions(wheel: Wheel) -> list[str]:
    """``GPU_MEMORY_ALL_TYPES`` of ``sglang/srt/constants.py``: the regions release/resume know."""
    tree = wheel.tree("sglang/srt/constants.py")
    values: dict[str, str] = {}
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                values[name] = value.value
            elif name == "GPU_MEMORY_ALL_TYPES" and isinstance(value, ast.List):
                return [values[e.id] for e in value.elts if isinstance(e, ast.Name)]
    return [v for k, v in values.items() if k.startswith("GPU_MEMORY_TYPE_")]  # 0.5.3: no list


def sglang_surface(wheel: Wheel, version: str) -> dict:
    engine = _class(wheel.tree("sglang/srt/entrypoints/engine.py"), "Engine")
    sp_path = "sglang/srt/sampling/sampling_params.py"
    sampling = _class(wheel.tree(sp_path), "SamplingParams")
    init = next((n for n in sampling.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is not None:
        sp = {"file": sp_path, "kind": "init", "fields": [p["name"] for p in _signature(init)["params"]]}
    else:
        sp = {"file": sp_path, "kind": _struct_kind(sampling), "fields": _annotated_fields(sampling)}
    choices = []
    for path in ("sglang/srt/arg_groups/choices.py", "sglang/srt/server_args.py"):
        choices = _string_list(wheel.tree(path), "ATTENTION_BACKEND_CHOICES")
        if choices:
            break
    return {
        "memory_regions": {"file": "sglang/srt/constants.py", "names": _memory_regions(wheel)},
        "package": "sglang",
        "version": version,
        "wheel": wheel.path.name,
        "Engine": {
            "file": "sglang/srt/entrypoints/engine.py",
            "methods": _methods(engine, SGLANG_ENGINE_METHODS),
        },
        "ServerArgs": _sglang_server_args(wheel),
        "SamplingParams": sp,
        "attention_backends": choices,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+", help="package==version (vllm or sglang)")
    parser.add_argument(
        "--wheels",
        type=Path,
        default=Path.home() / ".cache" / "rlctl" / "wheels",
        help="download folder (outside the repository)",
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in args.specs:
        name, version = spec.split("==")
        wheel = Wheel(download(spec, args.wheels))
        surface = vllm_surface(wheel, version) if name == "vllm" else sglang_surface(wheel, version)
        path = args.out / f"{name}-{version}.json"
        path.write_text(json.dumps(surface, indent=1) + "\n")
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {wheel.path.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
