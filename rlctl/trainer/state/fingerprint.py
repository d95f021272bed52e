"""Silent weight-sync detection: after every sync the rollout engine's weights are fingerprinted
and compared with the trainer's, and the rollout-vs-trainer log-prob gap is watched.

A rollout copy that diverges from the trainer without an error (adapters never sent, corrupted
buckets, a tensor the loader skipped) trains on samples of another policy for as long as nobody
looks. The fingerprint (:mod:`rlctl.engines.fingerprint`) is computed on the trainer's parameters
as they are held (FSDP2 shards: each rank its own rows, one small all-reduce) cast to the dtype the
rollout copy stores, and on the rollout engine's own parameters; the first tensor that differs
fails the step. ``sync/fingerprint_ok`` is 1 (checked, equal), or -1 where the engine cannot be
read (said once in a warning); a mismatch never returns. Each sync reads other positions (the
sync's count is the fingerprint's salt, where the engine's ``weight_fingerprint`` takes one), so a
stale region escapes one sync with probability ``(1 - f)^64`` and ``n`` syncs with
``(1 - f)^(64 n)`` (:func:`rlctl.engines.fingerprint.detection_probability`).
"""

from __future__ import annotations

import inspect
import os
import time

from rlctl.engines.fingerprint import dtype_named, fingerprint_params, same
from rlctl.errors import RunError
from rlctl.log import get_logger
from rlctl.trainer.state.canary import canary_due

LOGGER = "rlctl.trainer.sync"  # looked up per warning, so the current configuration applies

# what a sync moved (rank 0's): bytes, and with delta pushes the changed share and the full size
SIZE_KEYS = (
    "sync/bytes",
    "sync/model_bytes",
    "sync/changed_frac",
    "sync/full_bytes",
    "sync/index_value_bytes",
    "sync/delta",
)
SKIP_ENV = "RLCTL_INJECT_SYNC_SKIP"  # "<HF tensor name>@<step>", read on the driver (tests only)


def skipped_tensor(step: int | None) -> str | None:
    """The tensor RLCTL_INJECT_SYNC_SKIP asks the sync after ``step`` to leave out (never set in runs)."""
    spec = os.environ.get(SKIP_ENV, "")
    name, _, at = spec.rpartition("@")
    if name and step is not None and at.isdigit() and int(at) == step:
        return name
    return None


def without(stream, name: str | None):
    """``stream`` of ``(name, tensor)`` (or of buckets of them) minus ``name``."""
    for item in stream:
        if isinstance(item, list):
            yield [(n, t) for n, t in item if n != name]
        elif item[0] != name:
            yield item


def takes_salt(rollout) -> bool:
    """Whether ``rollout.weight_fingerprint`` accepts a ``salt`` (rlctl's engines do; an engine
    of one's own written before it is fingerprinted at fixed positions, salt 0)."""
    read = getattr(rollout, "weight_fingerprint", None)
    if read is None:
        return False
    try:
        return "salt" in inspect.signature(read).parameters
    except (TypeError, ValueError):
        return False


class SyncCheck:
    """Compares a rollout engine's weights with the training engine's after each sync."""

    def __init__(self, rank: int = 0, canary=None) -> None:
        self.rank = rank
        self.version = 0  # syncs so far
        self.warned = False
        self.canary = canary  # a :class:`~.canary.SyncCanary`, run after the fingerprint

    def next_salt(self, rollout) -> int:
        """The fingerprint salt of the next sync into ``rollout`` (for :func:`~rlctl.engines.
        fingerprint.sample` taken while its weights stream): its count, or 0 (fixed positions)."""
        return self.version + 1 if takes_salt(rollout) else 0

    def after_sync(
        self, model, rollout, *, device, group=None, actor=None, params=None, what="weight sync"
    ) -> dict[str, float]:
        """Count the sync, then fingerprint both sides; RunError naming the first tensor that differs.
        Then, given the training engine ``actor`` and a canary, the canary where it is due
        (:func:`.canary.canary_due`).

        ``model`` is the training engine's module (plain or FSDP2), ``rollout`` an engine with
        ``weight_fingerprint(spec)``. Every rank of a sharded model must call this together.
        ``params``: ``(HF name, full tensor or Sampled)`` pairs to check instead of the model's own
        (a LoRA actor's merged weights, sampled with :meth:`next_salt` as they streamed, where the
        engine holds no adapter; the weights a rollout worker was pushed). ``what`` names the sync
        in errors (``weight sync`` then the count).
        """
        salt = self.next_salt(rollout)
        self.version += 1
        start = time.perf_counter()
        params = list(model.named_parameters()) if params is None else params
        spec = [(name, tuple(p.shape)) for name, p in params]
        read = getattr(rollout, "weight_fingerprint", None)
        theirs = (read(spec, salt=salt) if salt else read(spec)) if read is not None else None
        missing = (
            [name for name, _ in spec] if theirs is None else [n for n, _ in spec if theirs.get(n) is None]
        )
        if missing and not self.warned:  # once, at the first sync (the one at start)
            engine = type(rollout).__name__
            why = (
                f"{engine} cannot report its weights"
                if theirs is None
                else f"{engine} cannot read {len(missing)} tensor(s), first {missing[0]!r}"
            )
            get_logger(LOGGER).warning(
                "weight-sync check not available (sync/fingerprint_ok = -1)", reason=why
            )
            self.warned = True
        available = {n: v for n, v in (theirs or {}).items() if v is not None}
        dtypes = {n: dtype_named(v[2]) for n, v in available.items()}
        ours = (
            fingerprint_params(params, dtypes, device=device, group=group, salt=salt)
            if theirs is not None
            else {}
        )
        for name, _ in spec:
            if name in available and not same(ours[name], available[name]):
                t, r = ours[name][0], available[name][0]
                raise RunError(
                    f"{what} {self.version}: the rollout engine's {name!r} differs from the "
                    f"trainer's (fingerprint {r!r} vs {t!r}, rank {self.rank}); the rollout would "
                    "sample from weights the trainer does not have"
                )
        out = {
            "sync/fingerprint_ok": -1.0 if missing else 1.0,
            "sync/fingerprint_s": time.perf_counter() - start,
            "sync/weight_version": float(self.version),
        }
        if self.canary is not None and actor is not None and canary_due(self.version, rollout):
            out.update(self.canary.check(actor, rollout, self.version))
        return out


def merge_sync_metrics(per_rank: list[dict[str, float]] | None) -> dict[str, float]:
    """One record from every rank's: the worst verdicts, the slowest checks, rank 0's version."""
    records = [r for r in per_rank or [] if r]
    if not records:
        return {}
    return {
        **merge_push_metrics(records),
        "rollout/weight_version": records[0]["sync/weight_version"] - 1.0,  # the version this step sampled
        "sync/weight_version": records[0]["sync/weight_version"],
        # bytes loaded into rank 0's rollout engine (the full model, or a LoRA actor's adapter)
        **{k: records[0][k] for k in SIZE_KEYS if k in records[0]},
        # the largest rank's: extra memory of the planned move, rollout weights stored
        **{
            k: max(r[k] for r in records)
            for k in ("sync/peak_extra_bytes", "memory/rollout_weights_gib")
            if all(k in r for r in records)
        },
    }


def merge_push_metrics(records: list[dict[str, float]] | None) -> dict[str, float]:
    """The checks of syncs or weight pushes (every rank's, or a push's and a sync's) as one record: the
    worst fingerprint verdict and the slowest fingerprint of the records that have one; the
    canary's merge of the records where it ran."""
    records = [r for r in records or [] if r]
    printed = [r for r in records if "sync/fingerprint_ok" in r]
    out = {}
    if printed:
        out["sync/fingerprint_ok"] = min(r["sync/fingerprint_ok"] for r in printed)
        out["sync/fingerprint_s"] = max(r["sync/fingerprint_s"] for r in printed)
    return out | merge_canary_metrics([r for r in records if "sync/canary_ok" in r])


def merge_canary_metrics(records: list[dict[str, float]] | None) -> dict[str, float]:
    """The canary's ``sync/canary_*`` of several ranks (or checks) as one: the worst verdict, the
    largest gap, limit and time; empty unless every record has a verdict."""
    records = [r for r in records or [] if r]
    if not records or not all("sync/canary_ok" in r for r in records):
        return {}
    out = {"sync/canary_ok": min(r["sync/canary_ok"] for r in records)}
    keys = ("sync/canary_gap_mean", "sync/canary_gap_max", "sync/canary_limit", "sync/canary_s")
    for key in (*keys, "sync/canary_trainer_moved"):
        if all(key in r for r in records):
            out[key] = max(r[key] for r in records)
    if all("sync/canary_rollout_moved" in r for r in records):  # the rank that moved least
        out["sync/canary_rollout_moved"] = min(r["sync/canary_rollout_moved"] for r in records)
    return out


class LogProbGapAlarm:
    """Watches ``rollout/log_prob_diff_mean`` (mean |rollout log-prob - trainer log-prob| per token).

    A warning when it jumps (above ``JUMP`` times its running average and above ``FLOOR`` nats),
    a RunError above ``limit`` nats (``trainer.max_log_prob_gap``; 0 = off). The max over tokens is
    not used: single rare tokens differ by nats on healthy bf16 runs.
    """

    JUMP = 4.0
    FLOOR = 0.05
    DECAY = 0.9

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.average: float | None = None

    def check(self, metrics: dict[str, float], step: int) -> None:
        gap = metrics.get("rollout/log_prob_diff_mean")
        if gap is None:
            return
        if self.limit > 0 and gap > self.limit:
            raise RunError(
                f"rollout/log_prob_diff_mean = {gap:.4g} nats is above trainer.max_log_prob_gap = "
                f"{self.limit:g}: the rollout engine samples from a different policy than the trainer "
                f"scores (max gap {metrics.get('rollout/log_prob_diff_max', float('nan')):.4g})"
            )
        if self.average is not None and gap > self.FLOOR and gap > self.JUMP * self.average:
            get_logger(LOGGER).warning(
                "rollout-vs-trainer log-prob gap jumped",
                step=step,
                log_prob_diff_mean=round(gap, 5),
                running_mean=round(self.average, 5),
            )
        self.average = gap if self.average is None else self.DECAY * self.average + (1 - self.DECAY) * gap
