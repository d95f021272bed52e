"""Evaluating one version pin against the host's facts: pure data -> one ``Check``.

One small function per pin ``kind`` (``_EVAL``); :func:`evaluate_pin` never raises, so doctor, the
trainer's preflight and the tests share one verdict for every pin in ``pins.toml``.
:func:`evaluate_pins` (platform, engine) is the entry point for a run: one PASS/WARN/FAIL/SKIP
verdict per pin, with the fix for this host.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet

from rlctl.platforms.dists import Dist, parse_version
from rlctl.platforms.pin_matrix import matrix_outcome
from rlctl.platforms.pins import STATUS_VERDICT, Facts, Pin, outcome
from rlctl.verdict import FAIL, SKIP, WARN, Check

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


def _version(pin: Pin, f: Facts) -> Check:
    d = _installed(f, pin.params["package"])
    if d is None:
        return outcome("n/a", f"{pin.params['package']} is not installed")
    if _contains(pin.params["spec"], d.version):
        return outcome("ok", f"{d.name} {d.version} satisfies {pin.params['spec']}")
    return outcome("violated", f"{d.name} {d.version} violates {pin.params['spec']}: {pin.symptom}")


def _own_requirement(pin: Pin, f: Facts) -> Check:
    pkg, target = pin.params["package"], pin.params["target"]
    d, t = _installed(f, pkg), _installed(f, target)
    if d is None:
        return outcome("n/a", f"{pkg} is not installed")
    if t is None:
        return outcome("violated", f"{pkg} {d.version} needs {target}, which is not installed")
    req = d.requirement_on(target, any_extra=True)
    spec = str(req.specifier) if req is not None else pin.params.get("known", {}).get(d.version)
    if not spec:
        return outcome("ok", f"{pkg} {d.version} declares no version constraint on {target}")
    if _contains(spec, t.version):
        return outcome("ok", f"{pkg} {d.version} wants {target}{spec}; {t.version} installed")
    return outcome(
        "violated",
        f"{pkg} {d.version} wants {target}{spec} but {target} {t.version} is installed: {pin.symptom}",
    )


def _same_base(pin: Pin, f: Facts) -> Check:
    a, b = _installed(f, pin.params["package"]), _installed(f, pin.params["other"])
    if a is None:
        return outcome("n/a", f"{pin.params['package']} is not installed")
    if b is None:
        return outcome("violated", f"{a.name} {a.version} is installed but {pin.params['other']} is not")
    ra, rb = _release3(a.version), _release3(b.version)
    if ra is None or rb is None:
        return outcome("unknown", f"cannot parse {a.name} {a.version} / {b.name} {b.version}")
    if ra == rb:
        return outcome("ok", f"{a.name} {a.version} matches {b.name} {b.version}")
    return outcome(
        "violated", f"{a.name} {a.version} != {b.name} {b.version} (base version): {pin.symptom}"
    )


def _cuda_driver(pin: Pin, f: Facts) -> Check:
    major = f.torch.cuda_major
    if major is None:
        return outcome("n/a", f"torch is a {f.torch.flavour} build (no CUDA)")
    cuda_driver, driver = f.details.get("cuda_driver"), f.details.get("driver_version")
    if not cuda_driver or not driver:
        return outcome("unknown", "no NVIDIA driver version known (NVML did not answer)")
    problems = []
    if int(str(cuda_driver).split(".")[0]) < major:
        problems.append(
            f"torch is built for CUDA {f.torch.cuda}, the driver supports only CUDA {cuda_driver}"
        )
    floor = pin.params["floors"].get(str(major))
    if floor and _release3(driver) < _release3(floor):
        problems.append(f"driver {driver} is below {floor}, the floor for CUDA {major}.x")
    if problems:
        return outcome("violated", "; ".join(problems) + f": {pin.symptom}", _driver_fix(f, major, floor))
    return outcome("ok", f"driver {driver} (CUDA {cuda_driver}) runs torch's CUDA {f.torch.cuda}")


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


def _rocm(pin: Pin, f: Facts) -> Check:
    pkg = pin.params.get("package")
    if pkg and _installed(f, pkg) is None:
        return outcome("n/a", f"{pkg} is not installed")
    have = f.details.get("rocm_version")
    if not have:
        return outcome("unknown", "ROCm version unknown (no /opt/rocm/.info/version)")
    if _release3(have) >= _release3(pin.params["min"]):
        return outcome("ok", f"ROCm {have} >= {pin.params['min']}")
    return outcome("violated", f"ROCm {have} < {pin.params['min']}: {pin.symptom}")


def _rocm_arch(pin: Pin, f: Facts) -> Check:
    have, archs = f.details.get("rocm_version"), list(f.details.get("gfx_archs", []))
    if not archs:
        return outcome("unknown", "no GPU arch found in /sys/class/kfd topology")
    if not have:
        return outcome("unknown", f"ROCm version unknown for {', '.join(archs)}")
    bad = [
        f"{a} needs ROCm >= {pin.params['arch_min'][a]}"
        for a in archs
        if a in pin.params["arch_min"] and _release3(have) < _release3(pin.params["arch_min"][a])
    ]
    if bad:
        return outcome("violated", f"ROCm {have}: {'; '.join(bad)}: {pin.symptom}")
    return outcome("ok", f"ROCm {have} supports {', '.join(archs)}")


def _env(pin: Pin, f: Facts) -> Check:
    var, want = pin.params["variable"], pin.params["value"]
    have = f.env.get(var)
    if have is None or have == want:
        return outcome("ok", f"{var} is {'unset' if have is None else want}")
    return outcome("violated", f"{var}={have} (expected {want} or unset): {pin.symptom}")


def _env_default(pin: Pin, f: Facts) -> Check:
    """rlctl sets ``variable=value`` for the workers only when the user has not set it."""
    var, default = pin.params["variable"], pin.params["value"]
    have = f.env.get(var)
    if have is None:
        return outcome("ok", f"{var} is unset: rlctl sets {var}={default} for the worker processes")
    if have == default:
        return outcome("ok", f"{var}={have} (rlctl's default too)")
    return outcome("ok", f"{var}={have} is yours and is kept (rlctl's default is {default})")


def _env_unset(pin: Pin, f: Facts) -> Check:
    var = pin.params["variable"]
    unless = [u for u in pin.params.get("unless", []) if u in f.env]
    if var in f.env and unless:
        note = pin.params.get("unless_note") or f"{unless[0]} takes precedence"
        return outcome("ok", f"{var} is set, and so is {unless[0]}: {note}")
    if var in f.env:
        return outcome("violated", f"{var} is set: {pin.symptom}")
    return outcome("ok", f"{var} is unset")


def _env_ignored(pin: Pin, f: Facts) -> Check:
    """``variable`` set although the installed ``package`` never reads it (its ``file`` is read)."""
    var, pkg = pin.params["variable"], pin.params["package"]
    if var not in f.env:
        return outcome("ok", f"{var} is unset")
    d = _installed(f, pkg)
    if d is None:
        return outcome("n/a", f"{var} is set; {pkg} is not installed")
    path = f.dists.locate(pkg, pin.params["file"])
    if path is None:
        return outcome("unknown", f"{var} is set; cannot read {pin.params['file']} of {pkg} {d.version}")
    if var in path.read_text(encoding="utf-8", errors="replace"):
        return outcome("ok", f"{var} is set and {pkg} {d.version} reads it ({pin.params['file']})")
    return outcome(
        "violated", f"{var} is set but {pkg} {d.version} never reads it ({pin.params['file']}): {pin.symptom}"
    )


def _wheel_flavour(pin: Pin, f: Facts) -> Check:
    d = _installed(f, pin.params["package"])
    if d is None:
        return outcome("n/a", f"{pin.params['package']} is not installed")
    v = parse_version(d.version)
    local = (v.local or "") if v else ""
    cuda_deps = [r.name for r in d.requirements() if r.name.lower().startswith(("nvidia-", "cupy-cuda"))]
    want = pin.params["flavour"]
    if want in local:
        return outcome("ok", f"{d.name} {d.version} is a {want} build")
    if local.startswith("cu") or cuda_deps:
        why = f"local tag +{local}" if local.startswith("cu") else f"requires {', '.join(cuda_deps[:2])}"
        return outcome("violated", f"{d.name} {d.version} is a CUDA build ({why}): {pin.symptom}")
    return outcome("unknown", f"{d.name} {d.version}: cannot tell its build flavour")


def _forbidden(pin: Pin, f: Facts) -> Check:
    d = _installed(f, pin.params["package"])
    if d is None:
        return outcome("ok", f"{pin.params['package']} is not installed")
    return outcome("violated", f"{d.name} {d.version} is installed: {pin.symptom}")


def _import(pin: Pin, f: Facts) -> Check:
    d = _installed(f, pin.params["package"])
    if d is None:
        return outcome("n/a", f"{pin.params['package']} is not installed")
    if f.imports is None or pin.params["module"] not in f.imports:
        return outcome("unknown", f"import of {pin.params['module']} not tried (rlctl doctor --deep)")
    err = f.imports[pin.params["module"]]
    if not err:
        return outcome("ok", f"{pin.params['module']} imports")
    return outcome("violated", f"import {pin.params['module']} failed: {err}: {pin.symptom}")


_EVAL: dict[str, Callable[[Pin, Facts], Check]] = {
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


def _raw(pin: Pin, facts: Facts) -> Check:
    """The evaluator's answer for ``pin`` (status and reason), never raising."""
    if not pin.applies_to(facts.platform):
        return outcome("n/a", f"applies to {', '.join(pin.platforms)} only")
    for pkg in pin.params.get("unless_installed") or ():
        if facts.dists.get(pkg) is not None:
            return outcome("n/a", f"{pkg} is installed: its own pins apply instead")
    for pkg, spec in (pin.params.get("only_if") or {}).items():
        have = facts.dists.version(pkg)
        if have is None or not _contains(spec, have):
            return outcome("n/a", f"applies only with {pkg}{spec} ({pkg} {have or 'not installed'})")
    try:
        return _EVAL[pin.kind](pin, facts)
    except Exception as exc:  # keep doctor alive on odd metadata
        return outcome("unknown", f"could not evaluate: {type(exc).__name__}: {exc}")


def judge(pin: Pin, raw: Check) -> Check:
    """``raw`` (an evaluator's status) as the pin's verdict for a run: a violated pin FAILs at
    severity fail and WARNs at warn; an unknown one WARNs (SKIP for an import pin, which only
    ``doctor --deep`` can tell), with the fix for this host. Named ``pin:<id>``; its details
    hold the pin's id, package, status, severity, source and symptom."""
    status = raw.details["status"]
    if status == "violated":
        verdict = FAIL if pin.severity == "fail" else WARN
    elif status == "unknown":
        verdict = WARN if pin.kind != "import" else SKIP
    else:
        verdict = STATUS_VERDICT[status]
    fix = raw.fix or pin.fix if status in ("violated", "unknown") else ""
    if status == "unknown" and pin.kind != "import" and not raw.fix:
        fix = f"check by hand: {pin.source}"
    details = {
        "id": pin.id,
        "package": pin.package,
        "status": status,
        "severity": pin.severity,
        "source": pin.source,
        "symptom": pin.symptom,
    }
    return Check(f"pin:{pin.id}", verdict, raw.reason, fix, "pins", details)


def evaluate_pin(pin: Pin, facts: Facts) -> Check:
    """Check one pin against ``facts``; never raises (an evaluation bug becomes ``unknown``)."""
    return judge(pin, _raw(pin, facts))


def pin_record(check: Check) -> dict[str, str | None]:
    """A judged pin as the plan writes it (``plan.json``: id, package, status, severity, reason,
    fix, source)."""
    d = check.details
    return {
        "id": d["id"],
        "package": d["package"],
        "status": d["status"],
        "severity": d["severity"],
        "reason": check.reason,
        "fix": check.fix,
        "source": d["source"],
    }


def evaluate_pins(
    platform: Platform, engine: str | None = None, imports: Mapping[str, str] | None = None
) -> list[Check]:
    """Every pin of ``platform`` (shipped and its own :attr:`~Platform.pin_data`) judged on its
    host, for a run whose rollout engine is ``engine`` (None: all engines, as ``rlctl doctor``
    shows them). Pins about another rollout engine's packages are SKIP for that run ("the run uses
    vllm"). Doctor's pin rows and the trainer's preflight both come from here; a FAIL verdict must
    stop a run."""
    facts = platform.facts(dict(imports) if imports is not None else None)
    others: set[str] = set(platform.unsupported_engines)  # engines that never run here
    if engine is not None:
        for name, dists in platform.engine_dists.items():
            if name != engine:
                others |= set(dists) - set(platform.engine_dists.get(engine, ()))
        others |= {e for e in ("vllm", "sglang") if e != engine and e not in platform.engine_dists}
        others -= {"transformers", "torch-npu"}  # shared by every engine on its platform
    out: list[Check] = []
    for pin in platform.pins:
        if pin.package in others:
            why = (
                f"the run's rollout engine is {engine}"
                if engine
                else f"{pin.package} does not run on {platform.name}"
            )
            out.append(judge(pin, outcome("n/a", why)))
        else:
            out.append(evaluate_pin(pin, facts))
    return out
