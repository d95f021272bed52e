"""``rlctl doctor --deep``: slower checks that run real code in child processes with timeouts.

Imports each installed engine (an ABI mismatch shows up as ``undefined symbol``), asks torch how
many devices it sees, runs a small all-reduce on the platform's collective backend, and starts a
local Ray cluster as ``rlctl train`` does to list the addresses it listens on.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping

from rlctl.doctor import packages
from rlctl.platforms import Platform
from rlctl.verdict import Check, failed, passed, skipped


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def try_imports(p: Platform, timeout: float) -> dict[str, str]:
    """module -> "" when it imports, else the error's last line; all children run at once (the
    modules: :func:`rlctl.doctor.packages.imports`)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    procs = {}
    for dist, module in packages.imports(p).items():
        if p.host.dists.get(dist) is not None:
            procs[module] = subprocess.Popen(
                [sys.executable, "-c", f"import {module}"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
    out: dict[str, str] = {}
    for module, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=timeout)
            out[module] = "" if proc.returncode == 0 else (_last_line(err) or f"exit code {proc.returncode}")
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            out[module] = f"import timed out after {timeout:.0f}s"
    return out


def check_imports(results: Mapping[str, str]) -> list[Check]:
    rows = []
    for module, err in results.items():
        if err:
            rows.append(
                failed(
                    f"import:{module}", f"import {module} failed: {err}", "reinstall it (see pins)", "deep"
                )
            )
        else:
            rows.append(passed(f"import:{module}", f"import {module} works", "deep"))
    return rows


def check_devices(p: Platform, timeout: float) -> Check:
    """Does torch itself see the platform's devices? (The runtime half counts them in a child.)"""
    spec = p.runtime_spec()
    if spec.is_cpu:
        return skipped("deep:devices", "CPU: nothing to count", "deep")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "rlctl.devices", spec.to_json()], capture_output=True, text=True, timeout=timeout
        )
        n = int(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else -1
    except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return failed("deep:devices", f"torch device count failed: {exc}", "see the torch check", "deep")
    if n <= 0:
        why = _last_line(proc.stderr) if n < 0 else f"torch sees 0 {p.device_type} devices"
        return failed("deep:devices", why, f"check the driver and {p.visible_devices_env}", "deep")
    return passed("deep:devices", f"torch sees {n} {p.device_type} device(s)", "deep", count=n)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_collective(p: Platform, timeout: float, world: int | None = None) -> Check:
    """All-reduce across ``world`` child processes on the platform's backend (the platform's
    :meth:`~rlctl.platforms.Platform.collective_world` unless given: 2 on CPU)."""
    name = f"collective:{p.dist_backend}"
    if world is None:
        world = p.collective_world()
    if world < 1:
        return skipped(name, f"no {p.name} device to run a collective on", "deep")
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    base.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        WORLD_SIZE=str(world),
        RLCTL_DOCTOR_DEVICE=p.runtime_spec().to_json(),
        OMP_NUM_THREADS="1",
    )
    with tempfile.TemporaryDirectory(prefix="rlctl-doctor-") as tmp:
        procs = []
        for rank in range(world):
            env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            log = open(os.path.join(tmp, f"rank{rank}.err"), "w+")  # noqa: SIM115 - closed below
            procs.append((subprocess.Popen([sys.executable, "-m", "rlctl.doctor.collective"], env=env,
                                           stdout=subprocess.PIPE, stderr=log, text=True), log))  # fmt: skip
        results, errors = [], []
        for rank, (proc, log) in enumerate(procs):
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for q, _ in procs:
                    q.kill()
                errors.append(f"rank {rank} timed out after {timeout:.0f}s")
                break
            finally:
                log.seek(0)
                err_tail = _last_line(log.read())
            try:
                results.append(json.loads(_last_line(out)))
            except ValueError:
                errors.append(f"rank {rank} exited {proc.returncode}: {err_tail}")
        for proc, log in procs:
            proc.wait()
            log.close()
    bad = [r for r in results if not r.get("ok")]
    if errors or bad or len(results) != world:
        why = errors[0] if errors else bad[0].get("error") or f"all_reduce gave {bad[0].get('got')}"
        return failed(name, f"{world}-rank all_reduce on {p.dist_backend} failed: {why}",
                      f"check {p.dist_backend} setup (network interfaces, {p.visible_devices_env or 'devices'})",
                      "deep")  # fmt: skip
    return passed(
        name, f"{world}-rank all_reduce on {p.dist_backend} ({p.device_type}) gave the right sum", "deep"
    )


_RAY_LISTEN = (
    "import json; from rlctl.dispatch.backend_ray import connect; "
    "from rlctl.dispatch.ray_network import listening_addresses; "
    "connect('local', num_cpus=1, log_to_driver=False); print(json.dumps(listening_addresses()))"
)


def check_ray_listen(timeout: float) -> Check:
    """Start a local Ray cluster in a child as ``rlctl train`` would; where its servers listen."""
    from rlctl.dispatch.ray_network import off_loopback

    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    try:
        proc = subprocess.run([sys.executable, "-c", _RAY_LISTEN], capture_output=True, text=True,
                              timeout=timeout, env=env)  # fmt: skip
        addresses = json.loads(_last_line(proc.stdout))
    except subprocess.TimeoutExpired:
        return failed("ray-listen", f"a local Ray cluster did not start within {timeout:.0f}s", "ray status", "deep")
    except ValueError:
        why = _last_line(proc.stderr) or f"exit {proc.returncode}"
        return failed("ray-listen", f"a local Ray cluster failed to start: {why}", "pip install 'ray>=2.59'", "deep")
    exposed = off_loopback(addresses)
    if exposed:
        return failed("ray-listen", f"Ray listens beyond loopback: {', '.join(exposed)}",
                      "report this with `ray --version`", "deep")  # fmt: skip
    return passed("ray-listen", f"local cluster listens on {', '.join(addresses) or 'nothing'}", "deep")
