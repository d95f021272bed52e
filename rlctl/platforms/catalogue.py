"""Device specs for planning a run on hardware that is not (or not yet) this host.

``rlctl plan --hardware mi300x:8`` reads one entry: memory per device, dense bf16 peak, memory
bandwidth and the intra-node link each device has to its peers. Figures are the vendors' datasheet
values (dense, no sparsity), cited per entry; ``link_gb_s`` is the datasheet's aggregate
bidirectional figure per device, so one direction is half of it. ``cpu`` is this host, read from
``/proc/meminfo`` (no compute or link figure: nothing is moved over a link on one host).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rlctl.errors import UserError
from rlctl.platforms.host import Host

GIB = 1 << 30


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator model (or this host's CPU), as a plan needs it."""

    name: str
    platform: str  # the rlctl platform that drives it (nvidia | rocm | ascend | cpu)
    memory_gib: float  # per device
    bf16_tflops: float | None  # dense peak
    hbm_gb_s: float | None  # memory bandwidth, GB/s
    link_gb_s: float | None  # intra-node link per device, aggregate bidirectional GB/s
    source: str
    supports_bf16: bool = True
    # what a probe of the device reads: NVIDIA compute capability ("9.0"), ROCm gfx arch ("gfx942")
    arch: str | None = None
    interconnect: str | None = None  # the intra-node link ``link_gb_s`` is the figure of

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Memory is what the vendor's tools report on the device (what the probe of a real host reads and
# the engines size their pools from), not the datasheet's marketing "GB": nvidia-smi / NVML total in
# MiB, rocminfo's VRAM pool in KiB, npu-smi's HBM in MB (= MiB). Where no tool reading is recorded
# the datasheet's GB (10^9 bytes) is converted, and the entry's source says so.
def _gb(gb: float) -> float:
    return round(gb * 1e9 / GIB, 1)


def _mib(mib: int) -> float:
    return round(mib / 1024, 2)


CATALOGUE: dict[str, DeviceSpec] = {
    # NVIDIA H100 SXM5 datasheet (nvidia.com/en-us/data-center/h100, "H100 SXM" column): 80 GB HBM3,
    # 3.35 TB/s, BF16 Tensor Core 1,979 TFLOPS with sparsity (989.5 dense), NVLink 900 GB/s.
    # nvidia-smi on H100 80GB HBM3: 81559MiB total (NVIDIA/nccl#1264, modal-labs/modal-client#2797).
    "h100": DeviceSpec(
        "h100",
        "nvidia",
        _mib(81559),
        989.5,
        3350,
        900,
        "NVIDIA H100 SXM5 datasheet; memory: nvidia-smi 81559 MiB",
        arch="9.0",
        interconnect="NVLink 4",
    ),
    # NVIDIA H200 SXM datasheet (nvidia.com/en-us/data-center/h200): 141 GB HBM3e, 4.8 TB/s,
    # BF16 1,979 TFLOPS with sparsity (989.5 dense), NVLink 900 GB/s. nvidia-smi on H200: 143771MiB total
    # (the figure of nvidia-smi tables in public GitHub issues of H200 hosts).
    "h200": DeviceSpec(
        "h200",
        "nvidia",
        _mib(143771),
        989.5,
        4800,
        900,
        "NVIDIA H200 SXM datasheet; memory: nvidia-smi 143771 MiB",
        arch="9.0",
        interconnect="NVLink 4",
    ),
    # NVIDIA HGX B200 (nvidia.com/en-us/data-center/hgx): 8 GPUs, 1,440 GB HBM3e (180 GB each),
    # 8 TB/s per GPU, BF16 4.5 PFLOPS with sparsity per GPU (2,250 dense), NVLink 5 1.8 TB/s per GPU.
    # nvidia-smi on B200: 183359MiB total (NVIDIA/TensorRT-LLM#10278).
    "b200": DeviceSpec(
        "b200",
        "nvidia",
        _mib(183359),
        2250,
        8000,
        1800,
        "NVIDIA HGX B200 datasheet; memory: nvidia-smi 183359 MiB",
        arch="10.0",
        interconnect="NVLink 5",
    ),
    # NVIDIA A100 80GB SXM datasheet: 80 GB HBM2e, 2,039 GB/s, BF16 312 TFLOPS dense, NVLink 600 GB/s.
    # nvidia-smi on A100 80GB: 81920MiB total (modal-labs/modal-client#2797).
    "a100": DeviceSpec(
        "a100",
        "nvidia",
        _mib(81920),
        312,
        2039,
        600,
        "NVIDIA A100 80GB SXM datasheet; memory: nvidia-smi 81920 MiB",
        arch="8.0",
        interconnect="NVLink 3",
    ),
    # AMD Instinct MI300X datasheet (amd.com/.../instinct-mi300x-data-sheet.pdf): 192 GB HBM3,
    # 5.3 TB/s, peak BF16 1,307.4 TFLOPS dense, 7 Infinity Fabric links, 896 GB/s aggregate.
    # rocminfo on MI300X: VRAM pool 201310208 KB (ROCm/legacy-rocm-build#4414; in CPX mode 8 x
    # 25767706624 bytes, #4750) = 191.98 GiB.
    "mi300x": DeviceSpec(
        "mi300x",
        "rocm",
        round(201310208 / (1 << 20), 2),
        1307.4,
        5300,
        896,
        "AMD Instinct MI300X datasheet; memory: rocminfo 201310208 KB",
        arch="gfx942",
        interconnect="Infinity Fabric",
    ),
    # AMD Instinct MI325X datasheet: 256 GB HBM3E, 6 TB/s, peak BF16 1,307.4 TFLOPS dense,
    # Infinity Fabric 896 GB/s aggregate.
    "mi325x": DeviceSpec(
        "mi325x",
        "rocm",
        _gb(256),
        1307.4,
        6000,
        896,
        "AMD Instinct MI325X datasheet (memory: datasheet 256 GB)",
        arch="gfx942",
        interconnect="Infinity Fabric",
    ),
    # AMD Instinct MI355X (CDNA 4, gfx950; AMD launch, June 2025, as reported by The Register
    # 2025-06-12 and others): 288 GB HBM3E, 8 TB/s, dense BF16 about 2.5 PFLOPS (5 with sparsity),
    # Infinity Fabric 7 x 153.6 GB/s = 1075 GB/s. No rocminfo reading recorded: memory is the
    # datasheet's; approximate.
    "mi355x": DeviceSpec(
        "mi355x",
        "rocm",
        _gb(288),
        2500,
        8000,
        1075,
        "AMD Instinct MI355X launch figures (approximate; memory: datasheet 288 GB)",
        arch="gfx950",
        interconnect="Infinity Fabric",
    ),
    # Huawei Atlas 800T A2 / Ascend 910B (910B2/B3 modules): 64 GB HBM2e, ~1.6 TB/s, ~320 TFLOPS
    # FP16/BF16, HCCS 7 x 56 GB/s = 392 GB/s. Huawei publishes no per-chip datasheet in English: these
    # are the figures of public reports and Huawei's Atlas product pages; treat as approximate.
    # npu-smi info on 910B3: HBM-Usage(MB) x / 65536 (recorded in vllm-project/vllm-ascend#6512).
    "910b": DeviceSpec(
        "910b",
        "ascend",
        _mib(65536),
        320,
        1600,
        392,
        "Huawei Atlas 800T A2 product page (approximate); memory: npu-smi 65536 MB",
        arch=None,
        interconnect="HCCS",
    ),
    # Ascend 910C (two 910B dies in one package): 128 GB HBM, 3.2 TB/s, ~780 TFLOPS BF16, 784 GB/s
    # interconnect (public reports, e.g. TechPowerUp 2025-04-21 citing DigiTimes); approximate.
    "910c": DeviceSpec(
        "910c",
        "ascend",
        _gb(128),
        780,
        3200,
        784,
        "public reports (approximate)",
        arch=None,
        interconnect="HCCS",
    ),
}


def host_memory_bytes(host: Host | None = None) -> int | None:
    """``MemTotal`` of ``/proc/meminfo`` in bytes (None where the file is unreadable)."""
    text = (host or Host()).read("/proc/meminfo")
    for line in (text or "").splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024
    return None


def cpu_spec(host: Host | None = None) -> DeviceSpec:
    """This host as a planning target: its RAM, no compute peak, no link (one process per rank)."""
    mem = host_memory_bytes(host)
    return DeviceSpec(
        "cpu",
        "cpu",
        round(mem / GIB, 1) if mem else 0.0,
        None,
        None,
        None,
        "this host (/proc/meminfo MemTotal)",
        supports_bf16=False,
    )


def device_spec(name: str, host: Host | None = None) -> DeviceSpec:
    """The catalogue entry ``name`` (case-insensitive); ``cpu`` is this host."""
    key = name.strip().lower()
    if key == "cpu":
        return cpu_spec(host)
    if key not in CATALOGUE:
        raise UserError(f"unknown device {name!r}; expected one of: {', '.join(known_devices())}")
    return CATALOGUE[key]


def known_devices() -> list[str]:
    return [*CATALOGUE, "cpu"]


def parse_hardware(text: str, host: Host | None = None) -> tuple[DeviceSpec, int]:
    """``"mi300x:8"`` -> (the MI300X spec, 8 devices per node); ``"h100"`` means one device."""
    name, _, count = text.partition(":")
    spec = device_spec(name, host)
    if not count:
        return spec, 1
    if not count.isdigit() or int(count) < 1:
        raise UserError(f"--hardware: expected DEVICE[:COUNT] with COUNT >= 1, got {text!r}")
    return spec, int(count)
