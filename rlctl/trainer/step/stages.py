"""Driver-side stages of a step that need no worker: rewards, KL penalty, advantages, metrics.

They act on the step's DataProto with small tensors (scores, masks, log-probs), so they run on
the driver where they are easy to read and to change.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from rlctl.algorithms import get_adv_estimator, rollout_is_weights
from rlctl.algorithms.kl import apply_kl_penalty
from rlctl.dispatch import DataProto


class StageTimer:
    """Seconds per named stage of one step (``time/<stage>`` metrics)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}": v for k, v in self.seconds.items()}


SEQUENCE_KEYS = ("input_ids", "attention_mask", "position_ids")  # (B, prompt + response)
# What the training-side workers read; everything else (text columns, scores) stays on the driver.
WORKER_KEYS = (
    *SEQUENCE_KEYS,
    "responses",
    "response_mask",
    "old_log_probs",
    "ref_log_probs",
    "values",
    "returns",
    "advantages",
    "rollout_is_weights",
    "rollout_log_probs",  # the actor's loss corrects with them when the driver did not
)


def for_workers(batch: DataProto) -> DataProto:
    """The tensors the workers need, without the driver-only columns (less to serialise per call)."""
    return batch.select([k for k in WORKER_KEYS if k in batch.batch], non_tensor_keys=[])


RESPONSE_KEYS = ("responses", "response_mask", "rollout_log_probs", "token_level_scores")  # (B, response)


def trim_response_padding(batch: DataProto) -> DataProto:
    """Drop trailing response columns that no row uses (every later pass computes fewer tokens).

    Exact: causal attention never looks right, and every loss and metric is masked. A column is
    used when any row attends to it: multi-turn responses hold observation tokens (attention 1,
    response mask 0) between the model's turns.
    """
    t = batch.batch
    width = t["responses"].shape[1]
    used = int(last_used_index(t["attention_mask"][:, -width:]).max().item()) + 1 if len(batch) else width
    if used >= width:
        return batch
    cut = width - max(used, 1)
    tensors = {k: v[:, :-cut] if k in SEQUENCE_KEYS or k in RESPONSE_KEYS else v for k, v in t.items()}
    return DataProto.from_dict(tensors=tensors, non_tensors=batch.non_tensor, meta=batch.meta)


def mean_metrics(records: list[dict[str, float]] | dict[str, float]) -> dict[str, float]:
    """Average a list of metric dicts key by key (keys missing from a record are skipped)."""
    if isinstance(records, dict):
        return records
    keys = {k for m in records for k in m}
    return {k: float(np.mean([m[k] for m in records if k in m])) for k in keys}


def last_used_index(mask: torch.Tensor) -> torch.Tensor:
    """Per row, the index of the last nonzero entry of ``mask`` (0 for an all-zero row)."""
    positions = torch.arange(1, mask.shape[-1] + 1, device=mask.device)
    return ((mask != 0).long() * positions).max(dim=-1).values.sub(1).clamp(min=0)


def token_level_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Place each sequence's scalar score on its last response token (outcome reward); in a
    multi-turn response that is the model's last token, not an observation's."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = last_used_index(response_mask)
    out[torch.arange(len(scores)), last] = scores.float()
    return out * (response_mask.sum(-1, keepdim=True) > 0)


def compute_advantages(batch: DataProto, algo, kl_ctrl) -> tuple[DataProto, dict[str, float]]:
    """Rewards (with the optional in-reward KL penalty), then the profile's advantage estimator."""
    t = batch.batch
    metrics: dict[str, float] = {}
    rewards = t["token_level_scores"]
    extra: dict[str, torch.Tensor] = {}
    if algo.use_kl_in_reward:
        rewards, kl_metrics = apply_kl_penalty(
            t["token_level_scores"],
            t["old_log_probs"],
            t["ref_log_probs"],
            t["response_mask"],
            kl_ctrl,
            kind=algo.kl_penalty,
        )
        # verl's names; the KL loss's own value is actor/kl_loss (one key per quantity)
        metrics["actor/reward_kl_penalty"] = kl_metrics["reward_kl_penalty"]
        metrics["actor/reward_kl_penalty_coeff"] = kl_metrics["reward_kl_penalty_coeff"]
    if algo.rollout_correction != "off" and "old_log_probs" in t:
        # Train/inference mismatch correction with the rollout engine's own log-probs (without an
        # old-log-prob pass the actor's loss computes it from the update's own log-probs).
        extra["rollout_is_weights"], is_metrics = rollout_is_weights(
            t["old_log_probs"],
            t["rollout_log_probs"],
            t["response_mask"],
            level=algo.rollout_correction,
            mode=algo.rollout_correction_mode,
            threshold=algo.rollout_correction_threshold,
        )
        metrics.update({f"rollout_corr/{k}": v for k, v in is_metrics.items()})
    estimator = get_adv_estimator(algo.adv_estimator)
    kwargs = {
        "token_level_rewards": rewards,
        "response_mask": t["response_mask"],
        "index": batch.non_tensor["uid"],
        "gamma": algo.gamma,
        "lam": algo.lam,
        "norm_adv_by_std_in_grpo": algo.norm_adv_by_std,
    }
    if "values" in t:
        kwargs["values"] = t["values"]
    if "reward_baselines" in t:
        kwargs["reward_baselines"] = t["reward_baselines"]
    advantages, returns = estimator(**kwargs)
    out = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "advantages": advantages, "returns": returns, **extra}
    )
    return batch.union(out), metrics


def batch_metrics(batch: DataProto, max_new_tokens: int, stop_ids: list[int]) -> dict[str, float]:
    """Reward, accuracy and response-length statistics of one step's batch (verl's names).

    A response is clipped when it used all ``max_new_tokens`` and its last token is not one of
    ``stop_ids``: one that ends on its stop token exactly at the budget finished.
    """
    t = batch.batch
    lengths = t["response_mask"].sum(-1).float()
    last = t["responses"][:, -1]
    ended = torch.isin(last, torch.tensor(stop_ids, dtype=last.dtype))
    scores = t["scores"].float()
    metrics = {
        "reward/score_mean": scores.mean().item(),
        "reward/score_std": scores.std(unbiased=False).item() if len(scores) > 1 else 0.0,
        "response_length/mean": lengths.mean().item(),
        "response_length/max": lengths.max().item(),
        "response_length/clip_ratio": ((lengths >= max_new_tokens) & ~ended).float().mean().item(),
    }
    if "acc" in t:
        metrics["reward/accuracy"] = t["acc"].float().mean().item()
    metrics.update(log_prob_gap_metrics(t))
    if "advantages" in t:
        mask = t["response_mask"].bool()
        metrics["adv/mean"] = t["advantages"][mask].mean().item() if mask.any() else 0.0
    return metrics


def log_prob_gap_metrics(t: dict[str, torch.Tensor]) -> dict[str, float]:
    """Train/inference mismatch: |rollout engine log-prob - training engine log-prob| over the
    response tokens (max and mean, nats), when both exist; watched by the trainer's
    :class:`~rlctl.trainer.state.fingerprint.LogProbGapAlarm`."""
    if "rollout_log_probs" not in t or "old_log_probs" not in t:
        return {}
    mask = t["response_mask"].bool()
    diff = (t["rollout_log_probs"] - t["old_log_probs"]).abs()[mask]
    return {
        "rollout/log_prob_diff_max": diff.max().item() if diff.numel() else 0.0,
        "rollout/log_prob_diff_mean": diff.mean().item() if diff.numel() else 0.0,
    }


def groups_with_signal(values: torch.Tensor, uids: np.ndarray) -> np.ndarray:
    """DAPO dynamic sampling's keep mask as numpy bools: rows whose group's values are not all equal.

    ``values`` come from ``rlctl.algorithms.dapo.dynamic_sampling_values`` (accuracy by default).
    One filter for the trainer and the tested helper: ``groups_with_variance`` (groups of one are
    kept, as verl).
    """
    from rlctl.algorithms.dapo import groups_with_variance

    return groups_with_variance(values, uids).numpy()
