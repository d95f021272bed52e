"""Evaluating one version pin against the host's facts: pure data -> ``PinOutcome``.

One small function per pin ``kind`` (``_EVAL``); :func:`evaluate_pin` never raises, so doctor, the
trainer's preflight and the tests share one verdict for every pin in ``pins.toml``.
:func:`evaluate_pins` (platform, engine) is the entry point for a run: one PASS/WARN/FAIL/SKIP
verdict per pin, with the fix for this host.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet

from rlctl.platforms.dists import Dist, parse_version
from rlctl.platforms.pin_matrix import matrix_outcome
from rlctl.platforms.pins import Facts, Pin, PinOutcome, load_pins

if TYPE_CHECKING:
    from rlctl.platforms.base import Platform


def _contains(spec: str, version: str) -> bool:
    v = parse_version(version)
    return v is not None and SpecifierSet(spec).contains(v, prereleases=True)


def _release3(version: str | None) -> tuple[int, ...] | None:
    v = parse_version(version)
    return (tuple(v.release) + (0, 0, 0))[:3] if v else None


def _installed(facts: Facts, name: str) -> Dist | None:
    return facts.dists.get(name)


def _version(pin: Pin, f: Facts) -> PinOutcome:
    d = _installed(f, pin.params["package"])
    if d is None:
        return PinOutcome("n/a", f"{pin.params['package']} is not installed")
    if _contains(pin.params["spec"], d.version):
        return PinOutcome("ok", f"{d.name} {d.version} satisfies {pin.params['spec']}")
    return PinOutcome("violated", f"{d.name} {d.version} violates {pin.params['spec']}: {pin.symptom}")


def _own_requirement(pin: Pin, f: Facts) -> PinOutcome:
    pkg, target = pin.params["package"], pin.params["target"]
    d, t = _installed(f, pkg), _installed(f, target)
    if d is None:
        return PinOutcome("n/a", f"{pkg} is not installed")
    if t is None:
        return PinOutcome("violated", f"{pkg} {d.version} needs {target}, which is not installed")
    req = d.requirement_on(target, any_extra=True)
    spec = str(req.specifier) if req is not None else pin.params.get("known", {}).get(d.version)
    if not spec:
        return PinOutcome("ok", f"{pkg} {d.version} declares no version constraint on {target}")
    if _contains(spec, t.version):
        return PinOutcome("ok", f"{pkg} {d.version} wants {target}{spec}; {t.version} installed")
    return PinOutcome(
        "violated",
        f"{pkg} {d.version} wants {target}{spec} but {target} {t.version} is installed: {pin.symptom}",
    )


def _same_base(pin: Pin, f: Facts) -> PinOutcome:
    a, b = _installed(f, pin.params["package"]), _installed(f, pin.params["other"])
    if a is None:
        return PinOutcome("n/a", f"{pin.params['package']} is not installed")
    if b is None:
        return PinOutcome("violated", f"{a.name} {a.version} is installed but {pin.params['other']} is not")
    ra, rb = _release3(a.version), _release3(b.version)
    if ra is None or rb is None:
        return PinOutcome("unknown", f"cannot parse {a.name} {a.version} / {b.name} {b.version}")
    if ra == rb:
        return PinOutcome("ok", f"{a.name} {a.version} matches {b.name} {b.version}")
    return PinOutcome(
        "violated", f"{a.name} {a.version} != {b.name} {b.version} (base version): {pin.symptom}"
    )


def _cuda_driver(pin: Pin, f: Facts) -> PinOutcome:
    major = f.torch.cuda_major
    if major is None:
        return PinOutcome("n/a", f"torch is a {f.torch.flavour} build (no CUDA)")
    cuda_driver, driver = f.details.get("cuda_driver"), f.details.get("driver_version")
    if not cuda_driver or not driver:
        return PinOutcome("unknown", "no NVIDIA driver version known (NVML did not answer)")
    problems = []
    if int(str(cuda_driver).split(".")[0]) < major:
        problems.append(
            f"torch is built for CUDA {f.torch.cuda}, the driver supports only CUDA {cuda_driver}"
        )
    floor = pin.params["floors"].get(str(major))
    if floor and _release3(driver) < _release3(floor):
        problems.append(f"driver {driver} is below {floor}, the floor for CUDA {major}.x")
    if problems:
        return PinOutcome("violated", "; ".join(problems) + f": {pin.symptom}", _driver_fix(f, major, floor))
    return PinOutcome("ok", f"driver {driver} (CUDA {cuda_driver}) runs torch's CUDA {f.torch.cuda}")


def _driver_fix(f: Facts, major: int, floor: str | None) -> str:
    """The driver fix for this host: an engine that pins torch exactly rules out "another torch"
    (vllm 0.33.0's PyPI wheel is a CUDA 13 build pinning torch==2.14.0)."""
    newer = (
        f"upgrade the NVIDIA driver to >= {floor} (CUDA {major}.x)" if floor else "upgrade the NVIDIA driver"
    )
    for engine in ("vllm", "sglang"):
        d = _installed(f, engine)
        req = d.requirement_on("torch") if d is not None else None
        if req is not None and any(s.operator == "==" for s in req.specifier):
            return (
                f"{newer}, or install {engine}'s CUDA {major - 1} build ({engine} {d.version} pins "
                f"torch{req.specifier}, so a torch for an older CUDA breaks it)"
            )
    return f"{newer}, or install a torch built for the driver's CUDA"


def _rocm(pin: Pin, f: Facts) -> PinOutcome:
    pkg = pin.params.get("package")
    if pkg and _installed(f, pkg) is None:
        return PinOutcome("n/a", f"{pkg} is not installed")
    have = f.details.get("rocm_version")
    if not have:
        return PinOutcome("unknown", "ROCm version unknown (no /opt/rocm/.info/version)")
    if _release3(have) >= _release3(pin.params["min"]):
        return PinOutcome("ok", f"ROCm {have} >= {pin.params['min']}")
    return PinOutcome("violated", f"ROCm {have} < {pin.params['min']}: {pin.symptom}")


def _rocm_arch(pin: Pin, f: Facts) -> PinOutcome:
    have, archs = f.details.get("rocm_version"), list(f.details.get("gfx_archs", []))
    if not archs:
        return PinOutcome("unknown", "no GPU arch found in /sys/class/kfd topology")
    if not have:
        return PinOutcome("unknown", f"ROCm version unknown for {', '.join(archs)}")
    bad = [
        f"{a} needs ROCm >= {pin.params['arch_min'][a]}"
        for a in archs
        if a in pin.params["arch_min"] and _release3(have) < _release3(pin.params["arch_min"][a])
    ]
    if bad:
        return PinOutcome("violated", f"ROCm {have}: {'; '.join(bad)}: {pin.symptom}")
    return PinOutcome("ok", f"ROCm {have} supports {', '.join(archs)}")


def _env(pin: Pin, f: Facts) -> PinOutcome:
    var, want = pin.params["variable"], pin.params["value"]
    have = f.env.get(var)
    if have is None or have == want:
        return PinOutcome("ok", f"{var} is {'unset' if have is None else want}")
    return PinOutcome("violated", f"{var}={have} (expected {want} or unset): {pin.symptom}")


def _env_default(pin: Pin, f: Facts) -> PinOutcome:
    """rlctl sets ``variable=value`` for the workers only when the user has not set it."""
    var, default = pin.params["variable"], pin.params["value"]
    have = f.env.get(var)
    if have is None:
        return PinOutcome("ok", f"{var} is unset: rlctl sets {var}={default} for the worker processes")
    if have == default:
        return PinOutcome("ok", f"{var}={have} (rlctl's default too)")
    return PinOutcome("ok", f"{var}={have} is yours and is kept (rlctl's default is {default})")


def _env_unset(pin: Pin, f: Facts) -> PinOutcome:
    var = pin.params["variable"]
    unless = [u for u in pin.params.get("unless", []) if u in f.env]
    if var in f.env and unless:
        note = pin.params.get("unless_note") or f"{unless[0]} takes precedence"
        return PinOutcome("ok", f"{var} is set, and so is {unless[0]}: {note}")
    if var in f.env:
        return PinOutcome("violated", f"{var} is set: {pin.symptom}")
    return PinOutcome("ok", f"{var} is unset")


def _env_ignored(pin: Pin, f: Facts) -> PinOutcome:
    """``variable`` set although the installed ``package`` never reads it (its ``file`` is read)."""
    var, pkg = pin.params["variable"], pin.params["package"]
    if var not in f.env:
        return PinOutcome("ok", f"{var} is unset")
    d = _installed(f, pkg)
    if d is None:
        return PinOutcome("n/a", f"{var} is set; {pkg} is not installed")
    path = f.dists.locate(pkg, pin.params["file"])
    if path is None:
        return PinOutcome("unknown", f"{var} is set; cannot read {pin.params['file']} of {pkg} {d.version}")
    if var in path.read_text(encoding="utf-8", errors="replace"):
        return PinOutcome("ok", f"{var} is set and {pkg} {d.version} reads it ({pin.params['file']})")
    return PinOutcome(
        "violated", f"{var} is set but {pkg} {d.version} never reads it ({pin.params['file']}): {pin.symptom}"
    )


def _wheel_flavour(pin: Pin, f: Facts) -> PinOutcome:
    d = _installed(f, pin.params["package"])
    if d is None:
        return PinOutcome("n/a", f"{pin.params['package']} is not installed")
    v = parse_version(d.version)
    local = (v.local or "") if v else ""
    cuda_deps = [r.name for r in d.requirements() if r.name.lower().startswith(("nvidia-", "cupy-cuda"))]
    want = pin.params["flavour"]
    if want in local:
        return PinOutcome("ok", f"{d.name} {d.version} is a {want} build")
    if local.startswith("cu") or cuda_deps:
        why = f"local tag +{local}" if local.startswith("cu") else f"requires {', '.join(cuda_deps[:2])}"
        return PinOutcome("violated", f"{d.name} {d.version} is a CUDA build ({why}): {pin.symptom}")
    return PinOutcome("unknown", f"{d.name} {d.version}: cannot tell its build flavour")


def _forbidden(pin: Pin, f: Facts) -> PinOutcome:
    d = _installed(f, pin.params["package"])
    if d is None:
        return PinOutcome("ok", f"{pin.params['package']} is not installed")
    return PinOutcome("violated", f"{d.name} {d.version} is installed: {pin.symptom}")


def _import(pin: Pin, f: Facts) -> PinOutcome:
    d = _installed(f, pin.params["package"])
    if d is None:
        return PinOutcome("n/a", f"{pin.params['package']} is not installed")
    if f.imports is None or pin.params["module"] not in f.imports:
        return PinOutcome("unknown", f"import of {pin.params['module']} not tried (rlctl doctor --deep)")
    err = f.imports[pin.params["module"]]
    if not err:
        return PinOutcome("ok", f"{pin.params['module']} imports")
    return PinOutcome("violated", f"import {pin.params['module']} failed: {err}: {pin.symptom}")


_EVAL: dict[str, Callable[[Pin, Facts], PinOutcome]] = {
    "version": _version,
    "own-requirement": _own_requirement,
    "same-base": _same_base,
    "cuda-driver": _cuda_driver,
    "rocm": _rocm,
    "rocm-arch": _rocm_arch,
    "matrix": matrix_outcome,
    "env": _env,
    "env-default": _env_default,
    "env-unset": _env_unset,
    "env-ignored": _env_ignored,
    "wheel-flavour": _wheel_flavour,
    "forbidden": _forbidden,
    "import": _import,
}


def evaluate_pin(pin: Pin, facts: Facts) -> PinOutcome:
    """Check one pin; never raises (an evaluation bug becomes ``unknown`` with the error)."""
    if not pin.applies_to(facts.platform):
        return PinOutcome("n/a", f"applies to {', '.join(pin.platforms)} only")
    for pkg in pin.params.get("unless_installed") or ():
        if facts.dists.get(pkg) is not None:
            return PinOutcome("n/a", f"{pkg} is installed: its own pins apply instead")
    for pkg, spec in (pin.params.get("only_if") or {}).items():
        have = facts.dists.version(pkg)
        if have is None or not _contains(spec, have):
            return PinOutcome("n/a", f"applies only with {pkg}{spec} ({pkg} {have or 'not installed'})")
    try:
        return _EVAL[pin.kind](pin, facts)
    except Exception as exc:  # keep doctor alive on odd metadata
        return PinOutcome("unknown", f"could not evaluate: {type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class PinVerdict:
    """One pin judged for a run: ``verdict`` PASS | WARN | FAIL | SKIP, with the fix for this host."""

    id: str
    verdict: str
    status: str  # the PinOutcome status: ok | violated | n/a | unknown
    reason: str
    fix: str
    severity: str
    source: str
    symptom: str

    def to_dict(self) -> dict[str, str]:
        return dict(vars(self))


def _verdict(pin: Pin, out: PinOutcome) -> str:
    if out.status == "ok":
        return "PASS"
    if out.status == "violated":
        return "FAIL" if pin.severity == "fail" else "WARN"
    if out.status == "unknown" and pin.kind != "import":
        return "WARN"
    return "SKIP"


def evaluate_pins(
    platform: Platform, engine: str | None = None, imports: Mapping[str, str] | None = None
) -> list[PinVerdict]:
    """Every shipped pin of ``platform`` judged on its host, for a run whose rollout engine is
    ``engine`` (None: all engines, as ``rlctl doctor`` shows them). Pins about another rollout
    engine's packages are SKIP for that run ("the run uses vllm"). Doctor's pin rows and the
    trainer's preflight both come from here; a FAIL verdict must stop a run."""
    facts = platform.facts(dict(imports) if imports is not None else None)
    others: set[str] = set(platform.unsupported_engines)  # engines that never run here
    if engine is not None:
        for name, dists in platform.engine_dists.items():
            if name != engine:
                others |= set(dists) - set(platform.engine_dists.get(engine, ()))
        others |= {e for e in ("vllm", "sglang") if e != engine and e not in platform.engine_dists}
        others -= {"transformers", "torch-npu"}  # shared by every engine on its platform
    out: list[PinVerdict] = []
    for pin in load_pins():
        if not pin.applies_to(platform.name):
            continue
        if pin.package in others:
            why = (
                f"the run's rollout engine is {engine}"
                if engine
                else f"{pin.package} does not run on {platform.name}"
            )
            result = PinOutcome("n/a", why)
        else:
            result = evaluate_pin(pin, facts)
        fix = result.fix or pin.fix if result.status in ("violated", "unknown") else ""
        if result.status == "unknown" and pin.kind != "import" and not result.fix:
            fix = f"check by hand: {pin.source}"
        out.append(
            PinVerdict(
                pin.id,
                _verdict(pin, result),
                result.status,
                result.reason,
                fix,
                pin.severity,
                pin.source,
                pin.symptom,
            )
        )
    return out
