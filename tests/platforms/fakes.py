"""Fakes at the boundaries this machine cannot reach: vendor sysfs/dev trees, SMI libraries,
installed distributions. Shapes follow the real APIs (nvidia-ml-py, pyrsmi, npu-smi output)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pynvml  # real nvidia-ml-py: its error classes make the fake raise what the library raises

from rlctl.platforms.host import Host
from rlctl.platforms.smi import parse_npu_smi, query_nvml, query_rocml


def make_dist(
    site: Path, name: str, version: str, requires: tuple[str, ...] = (), entry_points: str = ""
) -> Path:
    """A ``<name>-<version>.dist-info`` directory, as pip would leave it (METADATA only)."""
    d = site / f"{re.sub(r'[-.]+', '_', name)}-{version}.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (d / "METADATA").write_text("\n".join(lines) + "\n")
    if entry_points:
        (d / "entry_points.txt").write_text(entry_points)
    return d


def make_torch(site: Path, version: str, cuda: str | None = None, hip: str | None = None) -> None:
    """A fake torch: dist-info plus ``torch/version.py`` written like torch's build writes it."""
    make_dist(site, "torch", version)
    (site / "torch").mkdir(exist_ok=True)
    (site / "torch" / "version.py").write_text(
        "from typing import Optional\n\n"
        f"__version__ = '{version}'\n"
        "debug = False\n"
        f"cuda: Optional[str] = {cuda!r}\n"
        f"hip: Optional[str] = {hip!r}\n"
    )


def base_stack(
    site: Path, torch: str = "2.7.1+cpu", cuda: str | None = None, hip: str | None = None, ray: str = "2.60.0"
) -> None:
    make_torch(site, torch, cuda=cuda, hip=hip)
    make_dist(site, "transformers", "4.57.0")
    make_dist(site, "ray", ray)
    make_dist(site, "safetensors", "0.6.2")
    make_dist(site, "tokenizers", "0.22.1")


def touch(root: Path, abspath: str, text: str = "") -> None:
    p = root / abspath.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


@dataclass
class _Mem:  # c_nvmlMemory_t
    total: int
    free: int
    used: int


@dataclass
class FakePynvml:
    """nvidia-ml-py's module surface used by ``query_nvml``; values as the docs show them."""

    names: list[str] = field(default_factory=lambda: ["NVIDIA H200"] * 8)
    driver: str | bytes = "570.124.06"
    cuda_driver: int = 12080
    cc: tuple[int, int] = (9, 0)
    memory_total: int = 143771 << 20  # bytes: NVML's total on an H200 (143771 MiB)
    init_error: int | None = None  # an NVML_ERROR_* code to raise from nvmlInit
    shutdowns: int = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda_driver

    def nvmlDeviceGetCount(self) -> int:
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.names[h]

    def nvmlDeviceGetMemoryInfo(self, h: int) -> _Mem:
        return _Mem(total=self.memory_total, free=self.memory_total - 754_820_096, used=754_820_096)

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return self.cc


class ROCMLError_LibraryNotFound(Exception):  # noqa: N801 - pyrsmi's class name
    pass


@dataclass
class FakeRocml:
    """pyrsmi's ``rocml`` surface: getters return -1 / '' instead of raising."""

    names: list[str] = field(default_factory=lambda: ["AMD Instinct MI300X"] * 8)
    missing: bool = False

    def smi_initialize(self) -> None:
        if self.missing:
            raise ROCMLError_LibraryNotFound("ROCm SMI library not found")

    def smi_shutdown(self) -> None:
        pass

    def smi_get_device_count(self) -> int:
        return len(self.names)

    def smi_get_device_name(self, i: int) -> str:
        return self.names[i] if i < len(self.names) else ""

    def smi_get_device_memory_total(self, i: int) -> int:
        return 206_141_652_992 if i < len(self.names) else -1


NPU_SMI_INFO = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.0                   Version: 24.1.0                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 93.4        36                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3161 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | OK            | 91.8        35                0    / 0             |
| 0                         | 0000:01:00.0  | 0           0    / 0          3160 / 65536         |
+===========================+===============+====================================================+
"""


def nvidia_host(tmp: Path, pynvml_fake: FakePynvml | None = None, torch_cuda: str = "12.6", env=None) -> Host:
    root, site = tmp / "root", tmp / "site"
    touch(root, "/sys/module/nvidia/version", "570.124.06\n")
    for i in range(8):
        touch(root, f"/dev/nvidia{i}")
    touch(root, "/dev/nvidiactl")
    base_stack(site, torch=f"2.7.1+cu{torch_cuda.replace('.', '')}", cuda=torch_cuda)
    fake = pynvml_fake or FakePynvml()
    smi = {"nvidia": lambda: query_nvml(fake)}
    return Host(root=root, env=env or {}, path=[str(site)], smi=lambda v: smi[v]())


def rocm_host(
    tmp: Path, arch_version: int = 90402, rocm: str = "6.3.1-48", env=None, ray: str = "2.60.0"
) -> Host:
    root, site = tmp / "root", tmp / "site"
    touch(root, "/sys/module/amdgpu/initstate", "live\n")
    touch(root, "/dev/kfd")
    touch(root, "/opt/rocm/.info/version", rocm + "\n")
    touch(
        root, "/sys/class/kfd/kfd/topology/nodes/0/properties", "cpu_cores_count 96\ngfx_target_version 0\n"
    )
    for n in (1, 2):
        touch(root, f"/sys/class/kfd/kfd/topology/nodes/{n}/properties",
              f"cpu_cores_count 0\nsimd_count 1216\ngfx_target_version {arch_version}\n")  # fmt: skip
    base_stack(site, torch="2.7.1+rocm6.3", hip="6.3.42131", ray=ray)
    fake = FakeRocml()
    return Host(root=root, env=env or {}, path=[str(site)], smi=lambda v: query_rocml(fake))


def ascend_host(
    tmp: Path, cann: str = "8.3.RC1", env=None, torch: str = "2.7.1", torch_npu: str = "2.7.1"
) -> Host:
    root, site = tmp / "root", tmp / "site"
    for i in range(2):
        touch(root, f"/dev/davinci{i}")
    touch(root, "/dev/davinci_manager")
    touch(root, "/usr/local/Ascend/ascend-toolkit/latest/aarch64-linux/ascend_toolkit_install.info",
          f"package_name=Ascend-cann-toolkit\nversion={cann}\narch=aarch64\n")  # fmt: skip
    touch(root, "/usr/local/Ascend/driver/version.info", "Version=24.1.0\nascendhal_version=7.35.23\n")
    base_stack(site, torch=torch)
    (site / "torch" / "version.py").write_text(f"cuda = None\nhip = None\n__version__ = '{torch}'\n")
    make_dist(site, "torch-npu", torch_npu)
    return Host(root=root, env=env or {}, path=[str(site)], smi=lambda v: parse_npu_smi(NPU_SMI_INFO))


def cpu_host(tmp: Path, env=None) -> Host:
    (tmp / "root").mkdir(parents=True, exist_ok=True)
    base_stack(tmp / "site")
    return Host(
        root=tmp / "root", env=env or {}, path=[str(tmp / "site")], smi=lambda v: {"ok": False, "error": "x"}
    )


# ``npu-smi info`` on an Atlas 800 A2 (8 x 910B3) with one process holding NPU 2, recorded from the
# output pasted in vllm-project/vllm-ascend#6512 (npu-smi 25.2.0, CANN 8.3.RC2). The process table
# after the device table is what the old parser counted as extra devices.
NPU_SMI_910B_BUSY = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 25.2.0                   Version: 25.2.0                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 97.9        34                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3408 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | OK            | 89.5        32                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          3408 / 65536         |
+===========================+===============+====================================================+
| 2     910B3               | OK            | 92.3        32                0    / 0             |
| 0                         | 0000:81:00.0  | 0           0    / 0          41052/ 65536         |
+===========================+===============+====================================================+
| 3     910B3               | OK            | 92.4        32                0    / 0             |
| 0                         | 0000:82:00.0  | 0           0    / 0          3390 / 65536         |
+===========================+===============+====================================================+
| 4     910B3               | OK            | 95.6        37                0    / 0             |
| 0                         | 0000:01:00.0  | 0           0    / 0          3403 / 65536         |
+===========================+===============+====================================================+
| 5     910B3               | OK            | 97.2        38                0    / 0             |
| 0                         | 0000:02:00.0  | 0           0    / 0          3400 / 65536         |
+===========================+===============+====================================================+
| 6     910B3               | OK            | 91.0        36                0    / 0             |
| 0                         | 0000:41:00.0  | 0           0    / 0          3401 / 65536         |
+===========================+===============+====================================================+
| 7     910B3               | OK            | 95.4        37                0    / 0             |
| 0                         | 0000:42:00.0  | 0           0    / 0          3400 / 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| No running processes found in NPU 0                                                            |
+===========================+===============+====================================================+
| No running processes found in NPU 1                                                            |
+===========================+===============+====================================================+
| 2       0                 | 1333928       |                          | 37709                   |
+===========================+===============+====================================================+
| No running processes found in NPU 3                                                            |
+===========================+===============+====================================================+
| No running processes found in NPU 4                                                            |
+===========================+===============+====================================================+
| No running processes found in NPU 5                                                            |
+===========================+===============+====================================================+
| No running processes found in NPU 6                                                            |
+===========================+===============+====================================================+
| No running processes found in NPU 7                                                            |
+===========================+===============+====================================================+
"""


_A3_MID = "+" + "-" * 96 + "+"
_A3_END = "+" + "=" * 27 + "+" + "=" * 15 + "+" + "=" * 52 + "+"


def _a3_rows() -> str:
    """The device table of an Atlas A3 node (8 NPUs x 2 chips, name "Ascend910"), as recorded in
    vllm-project/vllm-ascend#4930 (npu-smi 25.2.3, CANN 8.5.0): each NPU id is printed once per
    chip, and the chip row carries the chip id and its Phy-ID (the /dev/davinciN number). Layout,
    names, ids and bus ids as recorded; the telemetry columns (not parsed) are simplified."""
    buses = ["9D", "9F", "99", "9B", "95", "97", "91", "93", "8D", "8F", "89", "8B", "85", "87", "81", "83"]
    out = []
    for npu in range(8):
        for chip in range(2):
            phy = 2 * npu + chip
            power = ("232.5" if npu == 0 else "170.6") if chip == 0 else "-"
            out.append(
                f"| {npu:<5} {'Ascend910':<19} | {'OK':<13} | {power:<11} 52                0    / 0             |"
            )
            out.append(
                f"| {chip:<5} {phy:<19} | 0000:{buses[phy]}:00.0  | 17          0    / 0          50242/ 65536         |"
            )
            out.append(_A3_END if chip else _A3_MID)
    return "\n".join(out) + "\n"


NPU_SMI_A3 = (
    "+------------------------------------------------------------------------------------------------+\n"
    "| npu-smi 25.2.3                   Version: 25.2.3                                               |\n"
    "+---------------------------+---------------+----------------------------------------------------+\n"
    "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|\n"
    "| Chip  Phy-ID              | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |\n"
    "+===========================+===============+====================================================+\n"
    + _a3_rows()
    + "+---------------------------+---------------+----------------------------------------------------+\n"
    "| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |\n"
    "+===========================+===============+====================================================+\n"
    "| 0       0                 | 3325989       |                          | 50128                   |\n"
    "| 0       0                 | 3330598       |                          | 132                     |\n"
    "| 0       1                 | 3328327       |                          | 50119                   |\n"
    "+===========================+===============+====================================================+\n"
    "| 1       0                 | 3330598       |                          | 50117                   |\n"
    "| 1       1                 | 3333165       |                          | 50119                   |\n"
    "+===========================+===============+====================================================+\n"
    "| No running processes found in NPU 2                                                            |\n"
    "+===========================+===============+====================================================+\n"
)

# Ray 2.60's shim around amdsmi, the lines that matter (ray/_private/thirdparty/pyamdsmi/pyamdsmi.py
# in the ray-2.60.0 wheel): amdsmi is imported at module level and only ImportError is caught.
RAY_260_PYAMDSMI = """\
# Python bindings shim: wraps the amd-smi Python interface with the same
# smi_* function signatures previously provided by the rocm-smi ctypes binding.
try:
    import amdsmi
    from amdsmi import (
        AmdSmiInitFlags,
        AmdSmiMemoryType,
        AmdSmiLibraryException,
    )
    _AMDSMI_AVAILABLE = True
except ImportError:
    amdsmi = None
    _AMDSMI_AVAILABLE = False
"""


def ray_needing_amdsmi(site: Path, version: str = "2.60.0") -> None:
    """A Ray install whose AMD accelerator manager counts GPUs through amdsmi (Ray 2.60)."""
    make_dist(site, "ray", version)
    shim = site / "ray" / "_private" / "thirdparty" / "pyamdsmi" / "pyamdsmi.py"
    shim.parent.mkdir(parents=True, exist_ok=True)
    shim.write_text(RAY_260_PYAMDSMI)


def nvidia_container_host(tmp: Path, env=None) -> Host:
    """A container on a GPU host started without GPU access: the host's /sys/module/nvidia shows
    through, /dev has no nvidia* nodes, and NVML cannot load libnvidia-ml.so.1 (nvml.h:
    NVML_ERROR_LIBRARY_NOT_FOUND = 12, what nvidia-ml-py raises as NVMLError_LibraryNotFound)."""
    root, site = tmp / "root", tmp / "site"
    touch(root, "/sys/module/nvidia/version", "570.124.06\n")
    base_stack(site, torch="2.7.1+cu126", cuda="12.6")
    fake = FakePynvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    return Host(root=root, env=env or {}, path=[str(site)], smi=lambda v: query_nvml(fake))


def ascend_busy_host(tmp: Path, a3: bool = False, cann: str = "8.3.RC2", env=None, **versions) -> Host:
    """An Ascend host whose npu-smi shows running processes: 8 x 910B3, or an A3 (16 chips)."""
    host = ascend_host(tmp, cann=cann, env=env, **versions)
    for i in range(16 if a3 else 8):
        touch(host.root, f"/dev/davinci{i}")
    text = NPU_SMI_A3 if a3 else NPU_SMI_910B_BUSY
    host.smi = lambda v: parse_npu_smi(text)
    return host
