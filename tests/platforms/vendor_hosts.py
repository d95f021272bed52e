"""The simulated hosts of the per-vendor engine settings, each as a real install would look.

Versions and requirements are the released ones (METADATA of the wheels / sdist):
vllm 0.33.0 (``Requires-Dist: torch==2.14.0``, ``transformers<5.21.0,>=5.16.1``; a CUDA 13 wheel),
vllm 0.23.0 (``torch==2.11.0``), vllm-ascend 0.23.0.post1 (sdist PKG-INFO: ``torch==2.10.0``,
``torch-npu==2.10.0.post4``, ``transformers==5.5.4``, ``Requires-Python >=3.10``), sglang 0.5.23
(``torch==2.14.1``, ``transformers==5.19.0``). The engines' config classes are written from the
recorded surfaces (``tests/engines/surfaces``) in the file layout of the release, so the field
check reads them as it reads an installed engine.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from rlctl.platforms.host import Host
from tests.platforms.fakes import (
    FakePynvml,
    ascend_busy_host,
    ascend_host,
    make_dist,
    make_torch,
    nvidia_host,
    ray_needing_amdsmi,
    rocm_host,
    touch,
)

SURFACES = Path(__file__).parents[1] / "engines" / "surfaces"


def replace(site: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """Install ``name==version`` in place of whatever version of it the base stack put there."""
    for old in site.glob(f"{re.sub(r'[-.]+', '_', name)}-*.dist-info"):
        shutil.rmtree(old)
    if name == "torch":
        cuda = re.search(r"\+cu(\d+)(\d)$", version)
        hip = "7.0.51831" if "+rocm" in version else None
        make_torch(site, version, cuda=f"{cuda[1]}.{cuda[2]}" if cuda else None, hip=hip)
    else:
        make_dist(site, name, version, requires)


def engine_source(site: Path, package: str, version: str) -> None:
    """The installed engine's config class, with the recorded fields, where the release keeps it."""
    surface = json.loads((SURFACES / f"{package}-{version}.json").read_text())
    if package == "vllm":
        body = "\n".join(f"    {f}: Any = None" for f in surface["EngineArgs"]["fields"])
        touch(
            site,
            "/vllm/engine/arg_utils.py",
            f"from dataclasses import dataclass\nfrom typing import Any\n\n\n@dataclass\nclass EngineArgs:\n{body}\n",
        )
        return
    fields = surface["ServerArgs"]["fields"]
    if surface["ServerArgs"]["kind"] == "msgspec":  # 0.5.20+: namespaces under arg_groups/fields/
        body = "\n".join(f"    {f}: Any = None" for f in fields)
        touch(
            site,
            "/sglang/srt/arg_groups/fields/model.py",
            f"from typing import Any\n\n\nclass ModelArgs:\n{body}\n",
        )
        touch(
            site,
            "/sglang/srt/server_args.py",
            "class ServerArgs:\n    pass\n\n\n_INPUT_NAMESPACES = [ModelArgs]\n",
        )
    else:
        body = "\n".join(f"    {f}: Any = None" for f in fields)
        touch(
            site,
            "/sglang/srt/server_args.py",
            f"from dataclasses import dataclass\nfrom typing import Any\n\n\n@dataclass\nclass ServerArgs:\n{body}\n",
        )


def vllm_033(site: Path, local: str = "") -> None:
    """vllm 0.33.0 and what its METADATA requires beside torch: ``flashinfer-python==0.7.2.post1``
    (the CUDA wheel; a ROCm build is installed from source or a container without it)."""
    make_dist(site, "vllm", f"0.33.0{local}", requires=("torch==2.14.0", "transformers<5.21.0,>=5.16.1"))
    if "+rocm" not in local:
        make_dist(site, "flashinfer-python", "0.7.2.post1")
    engine_source(site, "vllm", "0.33.0")


def h100(tmp: Path, driver: str) -> Host:
    """8 x H100 (SM 9.0) with the PyPI vllm 0.33.0 wheel (CUDA 13, torch 2.14.0+cu130)."""
    cuda_driver = {"570": 12080, "580": 13000}[driver.split(".")[0]]
    host = nvidia_host(
        tmp,
        FakePynvml(
            names=["NVIDIA H100 80GB HBM3"] * 8,
            driver=driver,
            cuda_driver=cuda_driver,
            memory_total=81559 << 20,  # nvidia-smi's total on an H100 80GB HBM3 (the catalogue's)
        ),
    )
    site = tmp / "site"
    replace(site, "torch", "2.14.0+cu130")
    replace(site, "transformers", "5.19.0")
    vllm_033(site)
    return host


def b200_sglang(tmp: Path, cc: tuple[int, int] = (10, 0)) -> Host:
    """8 x B200 (SM 10.0), driver 580, with sglang 0.5.23 and flashinfer."""
    host = nvidia_host(
        tmp,
        FakePynvml(
            names=["NVIDIA B200"] * 8, driver="580.82.07", cuda_driver=13000, cc=cc, memory_total=183359 << 20
        ),
    )
    site = tmp / "site"
    replace(site, "torch", "2.14.1+cu130")
    replace(site, "transformers", "5.19.0")
    make_dist(site, "sglang", "0.5.23", requires=("torch==2.14.1", "transformers==5.19.0"))
    make_dist(site, "flashinfer-python", "0.7.2")
    engine_source(site, "sglang", "0.5.23")
    return host


def mi300x(tmp: Path, env: dict[str, str] | None = None) -> Host:
    """8 x MI300X (gfx942), ROCm 7.0, ROCm vLLM 0.33.0 and ROCm flash-attn, amdsmi for Ray; by
    default CUDA_VISIBLE_DEVICES exported and verl's RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES=1."""
    if env is None:
        env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1"}
    host = rocm_host(tmp, rocm="7.0.0-38", env=env)
    site, root = tmp / "site", tmp / "root"
    replace(site, "torch", "2.14.0+rocm7.0")
    replace(site, "transformers", "5.19.0")
    ray_needing_amdsmi(site)
    make_dist(site, "amdsmi", "7.0.2")
    touch(root, "/opt/rocm/lib/libamd_smi.so")
    make_dist(site, "flash-attn", "2.8.3")
    vllm_033(site, "+rocm700")
    return host


def mi355x_aiter(tmp: Path) -> Host:
    """8 x MI355X (gfx950), ROCm 7.0, ROCm vLLM 0.33.0 with AMD's aiter (the "amd-aiter"
    distribution), amdsmi for Ray; no visible-devices variables exported."""
    host = rocm_host(tmp, arch_version=90500, rocm="7.0.0-38", env={})
    site, root = tmp / "site", tmp / "root"
    replace(site, "torch", "2.14.0+rocm7.0")
    replace(site, "transformers", "5.19.0")
    ray_needing_amdsmi(site)
    make_dist(site, "amdsmi", "7.0.2")
    touch(root, "/opt/rocm/lib/libamd_smi.so")
    make_dist(site, "amd-aiter", "0.1.5")
    vllm_033(site, "+rocm700")
    return host


def ascend_910b(tmp: Path) -> Host:
    """8 x 910B3, CANN 9.1.0, torch 2.10.0 + torch-npu 2.10.0.post4, vllm 0.23.0 + vllm-ascend 0.23.0.post1."""
    host = ascend_busy_host(tmp, cann="9.1.0", torch="2.10.0", torch_npu="2.10.0.post4")
    site = tmp / "site"
    replace(site, "transformers", "5.5.4")
    make_dist(
        site,
        "vllm",
        "0.23.0",
        requires=("torch==2.11.0", "transformers!=5.0.*,!=5.1.*,!=5.2.*,!=5.3.*,!=5.4.*,!=5.5.0,>=4.56.0"),
    )
    make_dist(
        site,
        "vllm-ascend",
        "0.23.0.post1",
        requires=("torch==2.10.0", "torch-npu==2.10.0.post4", "transformers==5.5.4"),
    )
    engine_source(site, "vllm", "0.23.0")
    return host


def ascend_sglang_only(tmp: Path) -> Host:
    """An Ascend host with SGLang 0.5.23 installed and no vLLM."""
    host = ascend_host(tmp, cann="9.1.0", torch="2.10.0", torch_npu="2.10.0.post4")
    make_dist(tmp / "site", "sglang", "0.5.23", requires=("torch==2.14.1",))
    engine_source(tmp / "site", "sglang", "0.5.23")
    return host
