"""Delta weight pushes (``rollout.delta_sync``): what changed since the receiving side's version.

Two senders, one encoding (:mod:`rlctl.engines.weight_delta`):

- the colocated sync (one rank, HF engine): the receiving side's version is the engine's own stored
  tensors, so each trained tensor, cast to the engine's dtype, is compared with what the engine
  holds and only the changed elements are written (no second copy of the model is kept).
- the off-policy pushes: rank 0 keeps a host copy, in the rollout dtype, of the version it last
  published (:class:`DeltaPublisher`); each publication is the delta from that version and says so
  (``base_version``). A rollout worker applies it only when it holds exactly that base version;
  otherwise (a version gap) it asks for a full push, which the publisher serves from the same copy.

Full pushes: the first sync or publication of a process (at start and after a resume, so a resumed
run's first push is always full) and after a version gap. Every push, delta or full, is then
fingerprinted as before; a delta also has each written element read back against the sender's
checksum (a wrong, lost or misplaced element fails that push, naming the rank).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from rlctl.engines.fingerprint import Sampled, sample
from rlctl.engines.weight_delta import Tally, TensorDelta, apply, diff, whole
from rlctl.errors import RunError

DELTA_KEYS = ("sync/bytes", "sync/changed_frac", "sync/full_bytes", "sync/index_value_bytes", "sync/delta")


def delta_ready(engine: Any) -> bool:
    """Whether ``engine`` can take delta pushes in place (the HF engine at TP 1)."""
    return callable(getattr(engine, "apply_deltas", None)) and getattr(engine, "tp", 1) == 1


def fail(bad: list[str], what: str, rank: int) -> None:
    """RunError for a delta whose read-back differs (``bad``: the tensors), naming the push and rank."""
    if bad:
        raise RunError(
            f"{what}: the delta push of {bad[0]!r} ({len(bad)} tensor(s)) did not land as sent "
            f"(rank {rank}): the rollout copy no longer equals the trainer's weights"
        )


def colocated_delta_sync(
    stream: Iterable[tuple[str, torch.Tensor]], engine: Any
) -> tuple[dict[str, float], list[str]]:
    """Write into ``engine`` only what differs between the trained ``stream`` (cast to the engine's
    dtype) and what it stores; returns the ``sync/*`` byte metrics and the tensors whose read-back
    failed."""
    held = engine.local_tensors()
    tally, bad = Tally(), []
    for name, tensor in stream:
        target = held.get(name)
        if target is None:
            raise RunError(f"delta sync: the rollout model has no parameter {name!r}")
        delta = diff(name, tensor.to(device=target.device, dtype=target.dtype), target)
        bad += engine.apply_deltas([delta])
        tally.add(delta)
    return {**tally.metrics(), "sync/delta": 1.0}, bad


class DeltaPublisher:
    """Rank 0's record of the version it last published, in the rollout dtype, on the host."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.base: dict[str, torch.Tensor] = {}
        self.version: int | None = None

    def publish(
        self, stream: Iterable[tuple[str, torch.Tensor]], version: int, salt: int
    ) -> tuple[dict[str, torch.Tensor], list[TensorDelta], int | None, list[tuple[str, Sampled]]]:
        """Weight version ``version`` of ``stream`` as (full tensors, deltas, base version,
        fingerprint samples at ``salt``): the delta from the version published last when that is
        ``version - 1`` (full tensors empty), else full (deltas empty, base None)."""
        delta = self.version is not None and self.version == version - 1
        full: dict[str, torch.Tensor] = {}
        deltas, samples = [], []
        for name, tensor in stream:
            new = tensor.detach().to("cpu", self.dtype)
            held = self.base.get(name) if delta else None
            if not delta:
                full[name] = new
                continue
            d = diff(name, new, held) if held is not None else whole(name, new)
            deltas.append(d)
            samples.append((name, sample(name, new, salt)))
            self.base[name] = new.clone() if held is None else held
            if held is not None:
                apply(held, d)
        if not delta:
            self.base = {name: t.clone() for name, t in full.items()}
        self.version = version
        return full, deltas, (version - 1 if delta else None), samples

    def full(self) -> tuple[dict[str, torch.Tensor], int]:
        """The last published version, whole (for a receiver holding another version)."""
        if self.version is None:
            raise RunError("delta push: a full push was asked for before anything was published")
        return {name: t.clone() for name, t in self.base.items()}, self.version
