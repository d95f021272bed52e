"""The multi-rank weight sync: each rank's FSDP2 shards planned into the rollout layout
(:mod:`rlctl.reshard`), bucket by bucket.

At rollout TP 1 every rank ends with whole HF tensors (layout ``hf``); at TP > 1 the planner writes
straight into the tensor-parallel engine's own pieces (the engine's ``reshard_format``: ``hf_tp``
for the HF engine, ``vllm`` for vLLM's merged and padded shards; its ``local_tensors()`` as the
outputs), so no rank materialises a tensor it does not hold and the extra memory stays within one
bucket (``stats["peak_extra_bytes"]``). SGLang's engine cuts full tensors itself
(``reshard_format = "hf"``): every rank then gets whole tensors, bucket by bucket, as at TP 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rlctl.reshard import reshard_train_to_rollout
from rlctl.trainer.state.fingerprint import without

SYNC_BUCKET_BYTES = 256 << 20


def rollout_layout(spec: Any) -> tuple[int, str]:
    """(tensor-parallel degree, TP group order) of a policy spec's rollout; (1, contiguous) for a
    worker without one (the reshard bench's)."""
    rollout = getattr(spec, "rollout", None)
    return (rollout.section.tensor_parallel, rollout.rank_order) if rollout else (1, "contiguous")


def planned_sync(
    worker: Any, skip: str | None, sent: Callable[[Iterable], Iterable], stats: dict[str, int]
) -> None:
    """Move ``worker.actor``'s shards into ``worker.rollout`` (every rank of the group together);
    ``skip`` leaves one tensor out (fault injection: a TP engine's piece is then planned into a
    buffer of its own and dropped, so the engine keeps its old values)."""
    tp, order = rollout_layout(getattr(worker, "spec", None))
    fmt = getattr(worker.rollout, "reshard_format", "hf_tp") if tp > 1 else "hf"
    tp = 1 if fmt == "hf" else tp  # an engine that cuts full tensors itself (SGLang) gets them whole
    buckets = reshard_train_to_rollout(
        worker.actor.model.config,
        train_world=worker.world_size,
        rank=worker.rank,
        rollout_tp=tp,
        local_shards=dict(worker.actor.export_weights("sharded")),
        bucket_bytes=SYNC_BUCKET_BYTES,
        rank_order=order,
        fmt=fmt,
        out=dict(without(worker.rollout.local_tensors().items(), skip)) if tp > 1 else None,
        stats=stats,
    )
    for bucket in sent(without(buckets, skip)):
        worker.rollout.update_weights(bucket)


def stored_gib(engine: Any) -> float | None:
    """The rollout weights ``engine`` stores on this rank (its TP pieces), in GiB; None when the
    engine does not expose them."""
    local = getattr(engine, "local_tensors", None)
    tensors = local() if local is not None else None
    if not tensors:  # vLLM at TP 1 keeps its weights to itself
        return None
    return sum(t.numel() * t.element_size() for t in tensors.values()) / 2**30
