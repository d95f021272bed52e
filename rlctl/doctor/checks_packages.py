"""Doctor checks about installed packages: versions, pins, and requirement consistency.

The consistency check is ``pip check`` restricted to the RL stack: every unconditional
``Requires-Dist`` of an installed engine/runtime must be installed at a matching version.
"""

from __future__ import annotations

from collections.abc import Mapping

from packaging.specifiers import SpecifierSet

from rlctl.doctor.check import CheckResult, failed, passed, skipped, warned
from rlctl.platforms import Platform, evaluate_pin, load_pins
from rlctl.platforms.dists import DistIndex, parse_version

# distribution -> required on every platform?
PACKAGES: dict[str, bool] = {
    "torch": True,
    "transformers": True,
    "ray": True,
    "safetensors": True,
    "tokenizers": True,
    "nvidia-ml-py": False,
    "pyrsmi": False,
    "amdsmi": False,
    "vllm": False,
    "sglang": False,
    "flash-attn": False,
    "flashinfer-python": False,
    "torch-npu": False,
    "vllm-ascend": False,
    "accelerate": False,
    "peft": False,
}
# whose requirements the consistency check verifies (when installed)
STACK = ("rlctl", "torch", "transformers", "ray", "vllm", "sglang", "vllm-ascend", "torch-npu", "flash-attn")


def check_packages(p: Platform) -> list[CheckResult]:
    """One row per package that matters: its version, or that it is missing."""
    rows = []
    for name, required in PACKAGES.items():
        d = p.host.dists.get(name)
        if d is not None:
            rows.append(passed(f"package:{name}", f"{name} {d.version}", "packages", version=d.version))
        elif required:
            rows.append(
                failed(f"package:{name}", f"{name} is not installed", f"pip install {name}", "packages")
            )
        else:
            rows.append(skipped(f"package:{name}", f"{name} not installed (optional)", "packages"))
    return rows


def check_pins(p: Platform, imports: Mapping[str, str] | None = None) -> list[CheckResult]:
    """One row per pin that applies to the platform, with its source and the symptom it prevents."""
    facts = p.facts(dict(imports) if imports is not None else None)
    rows = []
    for pin in load_pins():
        if not pin.applies_to(p.name):
            continue
        out = evaluate_pin(pin, facts)
        name = f"pin:{pin.id}"
        info = {"source": pin.source, "symptom": pin.symptom, "status": out.status}
        if out.status == "ok":
            rows.append(passed(name, out.reason, "pins", **info))
        elif out.status == "violated":
            make = failed if pin.severity == "fail" else warned
            rows.append(make(name, out.reason, pin.fix, "pins", **info))
        elif out.status == "unknown" and pin.kind == "import":
            rows.append(skipped(name, out.reason, "pins", **info))
        elif out.status == "unknown":
            rows.append(warned(name, out.reason, f"check by hand: {pin.source}", "pins", **info))
        else:
            rows.append(skipped(name, out.reason, "pins", **info))
    return rows


def unmet_requirements(dists: DistIndex, name: str) -> list[str]:
    """Problems with ``name``'s unconditional requirements, like pip check's lines."""
    d = dists.get(name)
    if d is None:
        return []
    problems = []
    for req in d.requirements():
        have = dists.get(req.name)
        if have is None:
            problems.append(f"{name} {d.version} requires {req}, which is not installed")
            continue
        v = parse_version(have.version)
        spec = SpecifierSet(str(req.specifier))
        if v is None or (str(spec) and not spec.contains(v, prereleases=True)):
            problems.append(f"{name} {d.version} requires {req} but {have.name} {have.version} is installed")
    return problems


def check_consistency(p: Platform) -> list[CheckResult]:
    """For each installed member of the RL stack: are its own requirements satisfied?"""
    rows = []
    for name in STACK:
        d = p.host.dists.get(name)
        if d is None:
            continue
        problems = unmet_requirements(p.host.dists, name)
        n = len(d.requirements())
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            rows.append(
                failed(
                    f"deps:{name}",
                    problems[0] + more,
                    f"reinstall matching versions: pip install '{name}=={d.version}' and its requirements",
                    "deps",
                    problems=problems,
                )
            )
        else:
            rows.append(passed(f"deps:{name}", f"{name} {d.version}: all {n} requirements satisfied", "deps"))
    return rows
