"""Greedy multi-turn evaluation in this process: what ``rlctl eval`` and SFT validation need for
a profile with ``agent.env`` (episodes scored by the environment, not single responses)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rlctl.agents.batch import ROW_COLUMNS, agent_meta, generate_episodes
from rlctl.agents.driver import agent_metrics, score_episodes
from rlctl.dispatch import DataProto


def episode_accuracy(
    engine: Any,
    tokenizer: Any,
    prompts: DataProto,
    profile: Any,
    tokenizer_path: str,
    chunk: int = 256,
    scorer: Any = None,
) -> dict[str, float]:
    """Greedy episodes on ``prompts`` with ``engine.generate``: ``accuracy`` (success), ``score_mean``
    and the ``agent/*`` means. With ``scorer`` (the profile's reward, a BatchScorer) episodes the
    environment or agent left to it are scored as in training (:func:`score_episodes`); without,
    ``score_mean`` is the environment's reward (NaN where it defers) and deferred episodes fail."""
    base_dir = str(Path(profile.source).resolve().parent) if profile.source else str(Path.cwd())
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    meta = {
        "max_new_tokens": profile.rollout.max_new_tokens,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": pad,
        "greedy": True,
        "agent": agent_meta(
            profile.agent.env,
            openai_agent=profile.agent.openai_agent,
            gather_s=profile.agent.gather_s,
            reward=profile.agent.reward,
            base_dir=base_dir,
            max_turns=profile.agent.max_turns,
            max_turn_tokens=profile.agent.max_turn_tokens,
            tokenizer_path=tokenizer_path,
            trust_remote_code=profile.model.trust_remote_code,
        ),
    }
    parts = []
    for start in range(0, len(prompts), chunk):
        part = prompts[start : start + chunk]
        keys = [k for k in ROW_COLUMNS if k in part.non_tensor]
        request = part.select(["input_ids", "attention_mask"], non_tensor_keys=keys)
        request.meta.update(meta)
        with torch.inference_mode():
            episodes = generate_episodes(engine.generate, request, seed=0)
        if scorer is not None:
            rows = DataProto.from_dict(tensors=episodes.batch, non_tensors={**part.non_tensor, **episodes.non_tensor})
            episodes, _ = score_episodes(rows, scorer, reward_mode=profile.agent.reward, shaping=False)
        parts.append(episodes)
    t = DataProto.concat(parts).batch
    out = {f"{k}": v for k, v in agent_metrics(t).items()}
    scored = scorer is not None
    out.update(
        {
            "accuracy": (t["acc"] if scored else t["agent_success"]).float().mean().item(),
            "score_mean": (t["scores"] if scored else t["agent_reward"]).float().mean().item(),
            "n": float(len(t["agent_success"])),
        }
    )
    return out
