"""DAPO helpers: overlong reward shaping and the dynamic-sampling group filter."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlctl.algorithms.advantages import group_ids
from rlctl.errors import UserError


def overlong_penalty(
    response_lengths: torch.Tensor, max_len: int, buffer_len: int, penalty_factor: float = 1.0
) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to each response's score (verl's DAPO reward manager).

    With ``expected = max_len - buffer_len``: ``min(0, -(length - expected) / buffer_len * factor)``,
    i.e. 0 up to ``expected``, falling linearly to ``-factor`` at ``max_len``.
    """
    if buffer_len <= 0:
        raise UserError(f"overlong_buffer.len = {buffer_len}: expected a positive number")
    if max_len < buffer_len:
        raise UserError(f"overlong_buffer.len = {buffer_len}: must not exceed max response length {max_len}")
    lengths = torch.as_tensor(response_lengths, dtype=torch.float32)
    exceed = lengths - (max_len - buffer_len)
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)


# Dynamic sampling's metric -> the batch column it reads (columns written by trainer.scoring).
# verl's recipe/dapo/dapo_ray_trainer.py filters on ``non_tensor_batch[filter_groups.metric]``;
# its DAPO recipes set ``filter_groups.metric=acc`` (recipe/dapo/run_dapo_qwen2.5_32b.sh), the
# reward manager's ``acc`` being the scorer's accuracy, or its float result, before the overlong
# penalty (verl/workers/reward_manager/dapo.py). ``seq_reward`` is verl's name for the shaped sum.
SIGNAL_COLUMNS = {"acc": "signal_acc", "score": "raw_scores", "seq_reward": "scores"}


def dynamic_sampling_values(tensors: Any, metric: str = "acc") -> torch.Tensor:
    """The per-sequence values dynamic sampling compares within a group, by verl's metric names.

    ``acc``: the scorer's accuracy (its score where it reports none), never the shaped reward,
    so an all-wrong group is not kept because its responses differ in length.
    """
    if metric not in SIGNAL_COLUMNS:
        raise UserError(
            f"algorithm.dynamic_sampling_metric = {metric!r}: expected one of {', '.join(SIGNAL_COLUMNS)}"
        )
    for column in (SIGNAL_COLUMNS[metric], "raw_scores", "scores"):
        if column in tensors:
            return tensors[column]
    raise KeyError(f"dynamic sampling needs a scored batch (no {SIGNAL_COLUMNS[metric]!r} column)")


def groups_with_variance(
    scores: torch.Tensor | np.ndarray, index: Any, keep_singletons: bool = True
) -> torch.Tensor:
    """Dynamic sampling's keep mask (batch,) bool: True for samples whose group's values are not all
    equal. The one group filter: the trainer's ``stages.groups_with_signal`` calls it.

    Groups of one are kept by default, as in verl's DAPO trainer (``std > 0 or len == 1``): a
    lone sample has no within-group spread to judge, and dropping it would empty every batch at
    ``rollout.n = 1``. "Not all equal" is exact (max > min), where verl's ``np.std(...) > 0`` can
    keep a group of equal non-binary floats over rounding; on 0/1 accuracy the two agree.
    """
    if isinstance(scores, torch.Tensor):
        values = scores.detach().to("cpu", torch.float64)
    else:
        values = torch.as_tensor(np.asarray(scores, dtype=np.float64))
    gid, n_groups = group_ids(index, values.shape[0])
    big = torch.full((n_groups,), float("inf"), dtype=values.dtype)
    lo = big.scatter_reduce(0, gid, values, reduce="amin")
    hi = (-big).scatter_reduce(0, gid, values, reduce="amax")
    count = torch.zeros(n_groups, dtype=torch.long).index_add_(0, gid, torch.ones_like(gid))
    keep = (hi > lo) | ((count == 1) & keep_singletons)
    return keep[gid]
