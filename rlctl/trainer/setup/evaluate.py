"""Greedy accuracy of a model on a profile's validation prompts, in this process (no workers)."""

from __future__ import annotations

from typing import Any

import torch

from rlctl.dispatch import DataProto
from rlctl.profile.schema import Profile
from rlctl.rewards.manager import build_reward_manager
from rlctl.rewards.sandbox import SandboxLimits
from rlctl.trainer.step.scoring import BatchScorer


def scorer_for(profile: Profile, tokenizer: Any) -> BatchScorer:
    rw = profile.reward
    manager = build_reward_manager(
        kind=rw.kind,
        function=rw.function or None,
        model_path=rw.model_path or None,
        timeout_s=rw.timeout_s if rw.kind in ("custom", "math", "verl") else None,
        sandbox=SandboxLimits(timeout_s=rw.timeout_s, memory_mb=rw.memory_mb, level=rw.sandbox),
        num_workers=rw.workers or None,
        max_error_rate=rw.max_error_rate,
        gsm8k_method=rw.gsm8k_method,
        format_score=rw.format_score,
    )
    return BatchScorer(
        tokenizer,
        manager,
        max_new_tokens=profile.rollout.max_new_tokens,
        overlong_buffer=profile.algorithm.overlong_buffer,
        overlong_penalty_factor=profile.algorithm.overlong_penalty,
    )


def greedy_accuracy(
    engine: Any,
    tokenizer: Any,
    prompts: DataProto,
    scorer: BatchScorer,
    max_new_tokens: int,
    stop_ids: list[int] | None = None,
    chunk: int = 512,
) -> dict[str, float]:
    """Generate greedily with a rollout engine and score; returns accuracy and mean score.

    Scored without training-time shaping (DAPO's overlong penalty): the scorer's own scores.
    """
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    parts = []
    for start in range(0, len(prompts), chunk):
        part = prompts[start : start + chunk]
        out = engine.generate(
            part.batch["input_ids"],
            part.batch["attention_mask"],
            max_new_tokens=max_new_tokens,
            greedy=True,
            eos_token_id=stop_ids if stop_ids is not None else tokenizer.eos_token_id,
            pad_token_id=pad,
        )
        scored, _ = scorer.score(DataProto.from_dict(tensors=out, non_tensors=part.non_tensor), shaping=False)
        parts.append(scored)
    batch = DataProto.concat(parts)
    result = {"score_mean": batch.batch["scores"].float().mean().item(), "n": float(len(batch))}
    if "acc" in batch.batch:
        result["accuracy"] = batch.batch["acc"].float().mean().item()
    return result


def evaluate_model(profile: Profile, model_path: str, limit: int | None = None) -> dict[str, float]:
    """Load ``model_path`` into the HF rollout engine and measure greedy validation accuracy."""
    from rlctl.engines.hf_rollout import HFRolloutEngine
    from rlctl.trainer.plan.choices import single_process_engines
    from rlctl.trainer.setup.models import load_tokenizer, stop_token_ids
    from rlctl.trainer.setup.prompts import load_prompts

    tokenizer = load_tokenizer(model_path, profile.model.trust_remote_code)
    _, val = load_prompts(profile, tokenizer)
    if val is None:
        from rlctl.errors import UserError

        raise UserError(f"{profile.source}: data.val: no validation prompts (set data.val to a file)")
    if limit:
        val = val[:limit]
    device, dtype = single_process_engines(profile)
    engine = HFRolloutEngine(
        model_path, device=device, dtype=dtype, trust_remote_code=profile.model.trust_remote_code
    )
    if profile.agent.episodic:  # multi-turn: episodes scored by the environment or agent, else [reward]
        from rlctl.agents.evaluate import episode_accuracy

        return episode_accuracy(
            engine, tokenizer, val, profile, model_path, scorer=scorer_for(profile, tokenizer)
        )
    with torch.inference_mode():
        return greedy_accuracy(
            engine,
            tokenizer,
            val,
            scorer_for(profile, tokenizer),
            profile.rollout.max_new_tokens,
            stop_ids=stop_token_ids(model_path, tokenizer),
        )
