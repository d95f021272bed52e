"""The driver's multi-turn rollout stage: episodes instead of single responses, environment rewards.

:class:`EpisodeRollout` has the two calls the trainer's step makes in multi-turn mode:
``generate`` (n episodes per prompt, rows of a prompt adjacent, run by the policy workers'
``generate_episodes``) and ``score`` (the environment's reward where it gave one, the profile's
reward on the decoded model tokens where it left it to the profile). The rest of the step
(log-probs, advantages, updates) is the single-turn step unchanged: only ``response_mask``
tokens enter a loss.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rlctl.agents.batch import ANSWER, CONVERSATION, ROW_COLUMNS, agent_meta
from rlctl.agents.loader import load_agent_function, load_environment
from rlctl.dispatch import DataProto
from rlctl.errors import UserError

AGENT_COLUMNS = ("agent_turns", "agent_tool_calls", "agent_tool_errors", "agent_success", "agent_truncated")


class EpisodeRollout:
    """Multi-turn generation and scoring for a run whose profile sets ``agent.env`` or
    ``agent.openai_agent``."""

    def __init__(self, ctx: Any) -> None:
        p = ctx.profile
        mode = getattr(p.trainer, "mode", "sync")
        if mode != "sync":
            raise UserError(
                f"{p.source}: agent.env: multi-turn rollout runs with trainer.mode = 'sync' only, got {mode!r}"
            )
        base_dir = str(Path(p.source).resolve().parent) if p.source else str(Path.cwd())
        if p.agent.openai_agent:  # a bad spec fails here, before any episode
            load_agent_function(p.agent.openai_agent, base_dir)
        else:
            load_environment(p.agent.env, base_dir)
        self.ctx = ctx
        self.meta = agent_meta(
            p.agent.env,
            openai_agent=p.agent.openai_agent,
            gather_s=p.agent.gather_s,
            reward=p.agent.reward,
            base_dir=base_dir,
            max_turns=p.agent.max_turns,
            max_turn_tokens=p.agent.max_turn_tokens,
            tokenizer_path=p.model.tokenizer or p.model.path,
            trust_remote_code=p.model.trust_remote_code,
        )

    def generate(
        self, prompts: DataProto, n: int, *, seed: int, validation: bool = False, greedy: bool = False
    ) -> DataProto:
        """n episodes per prompt, the prompt's columns carried (the trainer's ``generate`` contract)."""
        rows = prompts.repeat(n, interleave=True)
        keys = [k for k in ROW_COLUMNS if k in rows.non_tensor]
        request = rows.select(["input_ids", "attention_mask"], non_tensor_keys=keys)
        request.meta.update(self.ctx.sampling(validation=validation), seed=seed, agent=self.meta)
        if greedy:
            request.meta["greedy"] = True
        out = self.ctx.policy.generate_episodes(request)
        return DataProto.from_dict(
            tensors=out.batch,
            non_tensors={
                **rows.non_tensor,
                **{k: out.non_tensor[k] for k in (CONVERSATION, ANSWER) if k in out.non_tensor},
            },
            meta={
                "temperature": self.ctx.profile.rollout.temperature,
                "weight_version": out.meta.get("weight_version"),
            },
        )

    def score(
        self, batch: DataProto, scorer: Any, *, shaping: bool = True
    ) -> tuple[DataProto, dict[str, float]]:
        """The batch with its reward columns and the pass's error counts (:func:`score_episodes`)."""
        return score_episodes(batch, scorer, reward_mode=self.ctx.profile.agent.reward, shaping=shaping)


def score_episodes(
    batch: DataProto, scorer: Any, *, reward_mode: str = "agent", shaping: bool = True
) -> tuple[DataProto, dict[str, float]]:
    """The batch with its reward columns (the scorer's names) and the pass's error counts.

    ``scores`` is the environment's or agent's reward (``agent_reward``); rows where it is NaN
    (none given) are scored by ``scorer`` (the profile's reward) on the agent's returned final
    answer where it returned one (``agent_answered``), else on their decoded model tokens. With
    ``reward_mode = "sum"`` (:mod:`.outcome`) every episode whose agent did not fail is scored so
    and its agent's number added. ``acc`` is the episode's success: the scorer's where it scored.
    Length shaping applies to the scorer's part only.
    """
    t = batch.batch
    env_reward = t["agent_reward"].float()
    summed = reward_mode == "sum"
    if summed:
        failed = t["agent_errors"].bool() if "agent_errors" in t else torch.zeros_like(env_reward, dtype=torch.bool)
        deferred = ~failed
        bonus = torch.nan_to_num(env_reward, nan=0.0)
    else:
        deferred = torch.isnan(env_reward)
        bonus = torch.zeros_like(env_reward)
    acc = t["agent_success"].float()
    counts: dict[str, float] = {}
    if bool(deferred.any()):
        kwargs: dict[str, Any] = {}
        answered = t["agent_answered"].bool() if "agent_answered" in t else None
        if answered is not None and bool(answered.any()):
            decoded = scorer.decode(batch)
            answers = batch.non_tensor[ANSWER]
            kwargs["solutions"] = [
                str(answers[i]) if bool(answered[i]) else decoded[i] for i in range(len(decoded))
            ]
        scored, counts = scorer.score(batch, shaping=shaping, **kwargs)
        s = scored.batch
        raw = torch.where(deferred, s["raw_scores"].float() + bonus, env_reward)
        scores = torch.where(deferred, s["scores"].float() + bonus, env_reward)
        if "acc" in s:
            acc = torch.where(deferred, s["acc"].float(), acc)
        batch = scored
    else:
        raw = scores = env_reward
    tensors = {
        "raw_scores": raw,
        "scores": scores,
        "acc": acc,
        "signal_acc": acc,
        "agent_success": acc,  # agent/success: the scorer's verdict where it scored the episode
        "token_level_scores": on_last_model_token(scores, t["response_mask"]),
    }
    kept = DataProto.from_dict(
        tensors={k: v for k, v in batch.batch.items() if k not in tensors},
        non_tensors=batch.non_tensor,
        meta=batch.meta,
    )
    return kept.union(DataProto.from_dict(tensors=tensors)), counts


def on_last_model_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Outcome reward placed on each row's last model token (observations may follow earlier
    turns, never the last one); all zero for a row without model tokens."""
    positions = torch.arange(1, response_mask.shape[-1] + 1)
    last = ((response_mask != 0).long() * positions).max(dim=-1).values - 1
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = scores.float()[rows]
    return out


def agent_metrics(t: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per-step ``agent/*`` means over the batch's episodes (empty for a single-turn batch)."""
    if "agent_turns" not in t:
        return {}
    calls = t["agent_tool_calls"].float()
    errors = t["agent_tool_errors"].float()
    return {
        "agent/turns_mean": t["agent_turns"].float().mean().item(),
        "agent/tool_calls_mean": calls.mean().item(),
        "agent/tool_errors_mean": errors.mean().item(),
        "agent/tool_error_rate": (errors.sum() / calls.sum().clamp(min=1)).item(),
        "agent/success": t["agent_success"].float().mean().item(),
        "agent/truncated": t["agent_truncated"].float().mean().item(),
        **{
            f"agent/{key}": t[f"agent_{key}"].float().mean().item()
            for key in ("prefix_mismatch", "errors")  # the endpoint's (rlctl.agents.endpoint)
            if f"agent_{key}" in t
        },
    }
