"""In-process backend: every rank's host is a plain object in this process, run one after another.

Same worker code as the Ray backend, no Ray needed: for tests, debugging (breakpoints work), single
device runs, and GPU boxes where Ray cannot be installed. Calls are synchronous, so a non-blocking
call has already finished when its future is returned, and a ``timeout`` can only be checked after
a rank returns (it cannot interrupt one). torch.distributed works only with world_size 1 here.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from rlctl.dispatch.errors import CallTimeoutError, WorkerError
from rlctl.dispatch.futures import CallInfo
from rlctl.dispatch.pool import ResourcePool
from rlctl.dispatch.proto import DataProto
from rlctl.dispatch.worker import WorkerHost, free_port


@dataclass
class _Result:
    value: Any = None
    error: WorkerError | None = None


def fetch(parts: dict[int, Any]) -> dict[int, Any]:
    out = {}
    for r, res in parts.items():
        if res.error is not None:
            raise res.error
        out[r] = res.value
    return out


class InProcessBackend:
    name = "inprocess"

    def spawn_hosts(self, pool: ResourcePool, env: dict[str, str] | None) -> tuple[list[Any], list[dict]]:
        if env:
            os.environ.update(env)  # one process: the env is the process's env
        hosts = [WorkerHost(r, pool.world_size, in_process=True) for r in range(pool.world_size)]
        port = free_port()
        infos = [dict(h.info(), free_port=port) for h in hosts]
        for i in infos:
            i["ip"] = "127.0.0.1"
        return hosts, infos

    def add_role(
        self, hosts: list[Any], cls: type, init_kwargs: dict, ctxs: list[Any], timeout: float | None
    ) -> list:
        return [h.add_role(cls, init_kwargs, ctxs[r]) for r, h in enumerate(hosts)]

    def submit(
        self,
        info: CallInfo,
        hosts: list[Any],
        payloads: dict[int, tuple[tuple, dict]],
        keep: set[int],
        timeout: float | None,
    ) -> tuple[dict[int, Any], dict[int, Any]]:
        """Run every rank now, in rank order; returns (outputs, output row counts) per rank."""
        parts: dict[int, _Result] = {}
        sizes: dict[int, _Result] = {}
        start = time.monotonic()
        for r, (args, kwargs) in payloads.items():
            try:
                out = hosts[r].call(info.role, info.method, args, kwargs, fetch=fetch)
                parts[r] = _Result(out if r in keep else None)
                sizes[r] = _Result(len(out) if isinstance(out, DataProto) else None)
            except WorkerError as exc:
                parts[r] = _Result(error=exc)
                break  # later ranks would run after a failed rank: stop like a real group would fail
            if timeout is not None and time.monotonic() - start > timeout:
                parts[r] = _Result(
                    error=CallTimeoutError(
                        info.role,
                        info.method,
                        r,
                        f"exceeded {timeout}s (in-process: checked after rank {r} returned)",
                    )
                )
                break
        for r in payloads:
            parts.setdefault(
                r, _Result(error=WorkerError(info.role, info.method, r, "not run: an earlier rank failed"))
            )
            if parts[r].error is not None:
                sizes[r] = parts[r]
        return parts, sizes

    def gather(self, info: CallInfo, parts: dict[int, Any], wanted: list[int], timeout: float | None) -> dict:
        for r in sorted(parts):
            if parts[r].error is not None:
                raise parts[r].error
        return {r: parts[r].value for r in wanted}

    def ready(self, parts: dict[int, Any]) -> bool:
        return True

    def kill(self, hosts: list[Any]) -> None:
        hosts.clear()
