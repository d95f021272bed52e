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
        return _Mem(total=150_754_820_096, free=150_000_000_000, used=754_820_096)

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


def ascend_host(tmp: Path, cann: str = "8.3.RC1", env=None) -> Host:
    root, site = tmp / "root", tmp / "site"
    for i in range(2):
        touch(root, f"/dev/davinci{i}")
    touch(root, "/dev/davinci_manager")
    touch(root, "/usr/local/Ascend/ascend-toolkit/latest/aarch64-linux/ascend_toolkit_install.info",
          f"package_name=Ascend-cann-toolkit\nversion={cann}\narch=aarch64\n")  # fmt: skip
    touch(root, "/usr/local/Ascend/driver/version.info", "Version=24.1.0\nascendhal_version=7.35.23\n")
    base_stack(site, torch="2.7.1")
    (site / "torch" / "version.py").write_text("cuda = None\nhip = None\n__version__ = '2.7.1'\n")
    make_dist(site, "torch-npu", "2.7.1")
    return Host(root=root, env=env or {}, path=[str(site)], smi=lambda v: parse_npu_smi(NPU_SMI_INFO))


def cpu_host(tmp: Path, env=None) -> Host:
    (tmp / "root").mkdir(parents=True, exist_ok=True)
    base_stack(tmp / "site")
    return Host(
        root=tmp / "root", env=env or {}, path=[str(tmp / "site")], smi=lambda v: {"ok": False, "error": "x"}
    )
