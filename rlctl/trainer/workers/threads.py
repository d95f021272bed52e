"""How many torch threads a CPU rank runs: the host's cores shared by its training ranks and, in the
off-policy modes, as many rollout ranks (one rule for both sides)."""

from __future__ import annotations

import os

import torch

from rlctl.dispatch import Worker
from rlctl.trainer.plan.specs import EngineSpec


def _cpu_threads(worker: Worker, spec: EngineSpec, side: str = "train") -> int | None:
    """On CPU, set this rank's torch threads (Ray pins OMP_NUM_THREADS to 1); returns them.

    ``platform.cpu_threads`` (``spec.cpu_threads``) > 0 is taken as given. Auto (0): the host's
    ``local_world_size`` ranks share its cores equally. In the off-policy modes
    (``spec.separate_rollout``) a rollout group of the same shape runs in processes of its own on
    the same hosts (:mod:`.rollout`): its ranks (``side="rollout"``) take half the cores and
    the training ranks the rest, so the two sides together use each core once (OpenMP threads
    beyond the cores spin against each other). In-process workers share one process: nothing to
    split. Every rank gets at least one thread. None off CPU (nothing set).
    """
    if spec.device_type != "cpu":
        return None
    if side not in ("train", "rollout"):
        raise ValueError(f"side must be 'train' or 'rollout', got {side!r}")
    if spec.cpu_threads > 0:
        torch.set_num_threads(spec.cpu_threads)
        return spec.cpu_threads
    cores, ranks = os.cpu_count() or 1, max(1, worker.ctx.local_world_size)
    threads = max(1, cores // ranks)
    if (spec.separate_rollout or side == "rollout") and not worker.ctx.in_process:
        rollout, train = split_cpu_threads(cores, ranks)
        threads = rollout if side == "rollout" else train
    torch.set_num_threads(threads)
    return threads


def split_cpu_threads(cores: int, ranks: int) -> tuple[int, int]:
    """(rollout, train) threads per rank when a host's ``ranks`` training ranks share its ``cores``
    with as many rollout ranks: half the cores to rollout, the rest to training, at least one each."""
    rollout = max(1, cores // (2 * ranks))
    return rollout, max(1, (cores - ranks * rollout) // ranks)
