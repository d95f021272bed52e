"""A cross-process board of the newest published value and its version (a small Ray actor).

Partial rollouts on Ray: a busy rollout worker asks, between decode steps, whether a newer weight
version than it holds has been published. The driver's own objects are out of its reach, so the
driver posts ``(version, LazyInput)`` here after each publish; the worker polls the version (an int,
cheap) and only when it is newer fetches the value, resolving the lazy input straight from the
object store (:func:`rlctl.dispatch.backend_ray.fetch`), as a push's argument is resolved.
"""

from __future__ import annotations

from typing import Any

from rlctl.dispatch.futures import LazyInput, resolve_arg


class _Board:
    """The actor's state: versions only move forward."""

    def __init__(self) -> None:
        self.version, self.value = -1, None

    def post(self, version: int, value: Any) -> None:
        if version > self.version:
            self.version, self.value = version, value

    def latest_version(self) -> int:
        return self.version

    def latest(self) -> tuple[int, Any]:
        return self.version, self.value


class RayVersionBoard:
    """Driver side: ``post``; worker side (it pickles with its actor handle): ``newer(than)``."""

    def __init__(self) -> None:
        import ray

        # no CPU of its own: it answers between the rollout workers' decode steps, never computes
        self.handle = ray.remote(num_cpus=0)(_Board).remote()
        self.polls = 0

    def post(self, version: int, value: Any) -> None:
        """Publish ``value`` (a :class:`LazyInput` is resolved by the reader) as ``version``."""
        import ray

        ray.get(self.handle.post.remote(version, value))

    def newer(self, than: int) -> tuple[int, Any] | None:
        """The newest version and its value if newer than ``than``, else None (one small call)."""
        import ray

        from rlctl.dispatch.backend_ray import fetch

        self.polls += 1
        if ray.get(self.handle.latest_version.remote()) <= than:
            return None
        version, value = ray.get(self.handle.latest.remote())
        if isinstance(value, LazyInput):
            value, _ = resolve_arg(value, fetch)
        return version, value

    def close(self) -> None:
        import ray

        ray.kill(self.handle)
