"""Doctor checks about installed packages: versions, pins, and requirement consistency.

The consistency check is ``pip check`` restricted to the RL stack: every unconditional
``Requires-Dist`` of an installed engine/runtime must be installed at a matching version.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from packaging.specifiers import SpecifierSet

from rlctl.doctor import packages
from rlctl.platforms import Platform
from rlctl.platforms.dists import DistIndex, parse_version
from rlctl.platforms.pin_checks import evaluate_pins
from rlctl.verdict import PASS, SKIP, Check, failed, passed, skipped


def check_packages(p: Platform) -> list[Check]:
    """One row per package that matters: its version, or that it is missing (the list and its
    order: :func:`rlctl.doctor.packages.packages`)."""
    rows = []
    for name, required in packages.packages(p).items():
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


def check_pins(
    p: Platform, imports: Mapping[str, str] | None = None, engine: str | None = None
) -> list[Check]:
    """One row per pin that applies to the platform, with its source and the symptom it prevents
    (:func:`rlctl.platforms.pin_checks.evaluate_pins`: the verdicts a run's preflight uses)."""
    shown = ("source", "symptom", "status")  # the pin's id is in the row's name
    return [
        replace(v, fix="" if v.verdict in (PASS, SKIP) else v.fix, details={k: v.details[k] for k in shown})
        for v in evaluate_pins(p, engine, imports)
    ]


def unmet_requirements(dists: DistIndex, name: str, overrides: Mapping[str, str] | None = None) -> list[str]:
    """Problems with ``name``'s unconditional requirements, like pip check's lines; where
    ``overrides`` names an installed extension of ``name``, what it requires does not count."""
    d = dists.get(name)
    if d is None:
        return []
    plugin = dists.get((overrides or {}).get(name, ""))
    replaced = {r.name.lower() for r in plugin.requirements()} if plugin is not None else set()
    problems = []
    for req in d.requirements():
        if req.name.lower() in replaced:
            continue
        have = dists.get(req.name)
        if have is None:
            problems.append(f"{name} {d.version} requires {req}, which is not installed")
            continue
        v = parse_version(have.version)
        spec = SpecifierSet(str(req.specifier))
        if v is None or (str(spec) and not spec.contains(v, prereleases=True)):
            problems.append(f"{name} {d.version} requires {req} but {have.name} {have.version} is installed")
    return problems


def check_consistency(p: Platform) -> list[Check]:
    """For each installed member of the RL stack: are its own requirements satisfied?"""
    rows = []
    overrides = packages.overrides(p)
    for name in packages.stack(p):
        d = p.host.dists.get(name)
        if d is None:
            continue
        problems = unmet_requirements(p.host.dists, name, overrides)
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
