"""Refuse, before anything is allocated, a GGUF file whose declared model cannot be imported.

``rlctl model import`` dequantizes every tensor to fp32 and builds the model twice (the loaded
one and a fresh copy), so a 33 KB file whose header declares a 64-layer 8192-wide model would
allocate until the host dies. :func:`check_gguf` reads only the header, with every count and
length bounded by the bytes the file really has (``gguf.GGUFReader`` is not used: it builds one
Python object per array item a crafted header declares), then refuses in one line a file whose
tensors extend past its end, or whose fp32 import needs more than the host's MemAvailable.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from rlctl.errors import UserError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 8
HEADROOM = 1 << 30  # left to the rest of the host beside the import
COPIES = 2  # fp32 copies alive during an import: the loaded model and the fresh one
# GGUF metadata value types -> fixed size in bytes (8: string, 9: array are variable)
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFDeclared:
    """What a GGUF header declares: tensor count, elements, bytes in the file and where data ends."""

    tensors: int
    elements: int
    data_end: int  # the byte just past the last tensor's data
    file_size: int

    @property
    def fp32_bytes(self) -> int:
        return self.elements * 4


class _Header:
    """A bounds-checked little/big-endian reader over the file's bytes (an mmap: nothing copied)."""

    def __init__(self, data: mmap.mmap | bytes, path: Path) -> None:
        self.data, self.path, self.pos, self.order = data, path, 0, "<"

    def fail(self, what: str) -> UserError:
        return UserError(f"model import: {self.path}: not a readable GGUF file ({what} at byte {self.pos})")

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise self.fail(f"{what} needs {n} bytes, the file ends")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u32(self, what: str) -> int:
        return struct.unpack(self.order + "I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack(self.order + "Q", self.take(8, what))[0]

    def count(self, what: str, min_item: int) -> int:
        """A u64 count whose items (at least ``min_item`` bytes each) must fit in the rest."""
        n = self.u64(what)
        if n * min_item > len(self.data) - self.pos:
            raise self.fail(f"{what} {n} does not fit in the {len(self.data) - self.pos} bytes left")
        return n

    def string(self, what: str) -> bytes:
        return self.take(self.count(f"{what} length", 1), what)

    def skip_value(self, vtype: int, what: str, depth: int = 0) -> None:
        if vtype in _SCALAR:
            self.take(_SCALAR[vtype], what)
        elif vtype == _STRING:
            self.string(what)
        elif vtype == _ARRAY and depth < 4:
            itype = self.u32(f"{what} item type")
            if itype in _SCALAR:
                self.take(self.count(f"{what} items", _SCALAR[itype]) * _SCALAR[itype], what)
                return
            n = self.count(f"{what} items", 8 if itype == _STRING else 12)
            for _ in range(n):
                self.skip_value(itype, what, depth + 1)
        else:
            raise self.fail(f"{what}: unknown value type {vtype}")


def declared(path: Path) -> GGUFDeclared:
    """Parse ``path``'s GGUF header (metadata skipped, tensor infos read); UserError if malformed."""
    try:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    except ImportError:
        raise UserError(
            "model import: reading GGUF needs the 'gguf' package; install rlctl[realmodel]"
        ) from None
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size < 24:
            raise UserError(f"model import: {path}: not a GGUF file ({size} bytes, shorter than its header)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            h = _Header(data, path)
            if h.take(4, "magic") != MAGIC:
                raise UserError(f"model import: {path}: not a GGUF file (no GGUF magic)")
            version = h.u32("version")
            if version & 0xFFFF == 0:  # written on a big-endian host
                h.order, version = ">", struct.unpack(">I", struct.pack("<I", version))[0]
            if version not in (2, 3):
                raise h.fail(f"version {version}; expected 2 or 3")
            n_tensors = h.count("tensor count", 24)
            n_kv = h.count("metadata count", 12)
            alignment = DEFAULT_ALIGNMENT
            for _ in range(n_kv):
                key = h.string("metadata key")
                vtype = h.u32("metadata type")
                if key == b"general.alignment" and vtype == 4:
                    alignment = h.u32("general.alignment")
                    if alignment == 0 or alignment & (alignment - 1):
                        raise h.fail(f"general.alignment {alignment} is not a power of two")
                else:
                    h.skip_value(vtype, key.decode("utf-8", "replace"))
            elements, ends = 0, 0
            for _ in range(n_tensors):
                name = h.string("tensor name").decode("utf-8", "replace")
                n_dims = h.u32(f"tensor {name!r} dimensions")
                if n_dims > MAX_DIMS:
                    raise h.fail(f"tensor {name!r} has {n_dims} dimensions; at most {MAX_DIMS}")
                dims = [h.u64(f"tensor {name!r} shape") for _ in range(n_dims)]
                raw_type, offset = h.u32(f"tensor {name!r} type"), h.u64(f"tensor {name!r} offset")
                try:
                    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(raw_type)]
                except (ValueError, KeyError):
                    raise h.fail(f"tensor {name!r} has unknown type {raw_type}") from None
                n = 1
                for d in dims:
                    n *= d
                elements += n
                ends = max(ends, offset + n * type_size // block)
            data_offset = -(-h.pos // alignment) * alignment
    return GGUFDeclared(n_tensors, elements, data_offset + ends, size)


def mem_available() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _gb(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_gguf(path: Path, available: int | None = None) -> GGUFDeclared:
    """Refuse (UserError, one line) ``path`` when its declared tensors do not fit in the file or
    their fp32 import (:data:`COPIES` copies) plus :data:`HEADROOM` exceeds ``available`` bytes
    (default: the host's MemAvailable); returns what the header declares."""
    info = declared(path)
    if info.data_end > info.file_size:
        raise UserError(
            f"model import: {path}: its header declares {info.tensors} tensors ({info.elements:,} values) "
            f"whose data ends at byte {info.data_end:,}, but the file holds {info.file_size:,} bytes "
            "(truncated or crafted); not imported"
        )
    available = mem_available() if available is None else available
    need = COPIES * info.fp32_bytes
    if available is not None and need + HEADROOM > available:
        raise UserError(
            f"model import: {path}: importing its {info.elements:,} values as fp32 needs about {_gb(need)} "
            f"({COPIES} copies), the host has {_gb(available)} available (MemAvailable, "
            f"{_gb(HEADROOM)} kept free); not imported"
        )
    return info
