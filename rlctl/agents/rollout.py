"""Multi-turn rollout over any rollout engine's ``generate``, token-in token-out.

Each row is an episode: the model's turn is sampled from the row's token ids so far, the
environment answers it, and its observation is appended as token ids (:mod:`.render`); earlier
turns are never re-tokenised, so the ids the trainer scores are exactly those the engine sampled
or the observation added. Rows finish at different turns: each turn generates only for the rows
still running. An episode ends when the environment says done, after ``max_turns`` model turns, or
when the response budget ``max_tokens`` (model + observation tokens, like verl's
``response_length``) is spent; an observation that would leave no room for the model is not
appended (verl's ToolAgentLoop does the same, verl/experimental/agent_loop/tool_agent_loop.py).

Output follows the engines' batch convention with the turns laid end to end in ``responses``:
``response_mask`` is 1 only on model-sampled tokens, observation tokens have attention 1 and
response mask 0 (so they are context, never in a loss), ``rollout_log_probs`` is 0 on them.

``generate`` is the engines' ``generate(prompt_ids, prompt_mask, *, n, temperature, top_p, top_k,
max_new_tokens, greedy, eos_token_id, pad_token_id, seed)`` (HF, vLLM and SGLang share it). Each
turn re-sends the whole context: the HF engine recomputes its prefill, vLLM/SGLang with prefix
caching reuse it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlctl.agents.env import Environment, Row, Step, parse_turn
from rlctl.agents.render import ObservationRenderer
from rlctl.agents.rows import column, response_batch
from rlctl.errors import RunError

Generate = Callable[..., dict[str, torch.Tensor]]
STAT_KEYS = ("agent_turns", "agent_tool_calls", "agent_tool_errors", "agent_reward", "agent_success")


@dataclass
class Episode:
    """One row's running state: response ids, which are the model's, their log-probs, the talk."""

    env: Environment
    messages: list[dict[str, str]]
    ids: list[int] = field(default_factory=list)
    model: list[int] = field(default_factory=list)  # 1 on model tokens, 0 on observation tokens
    log_probs: list[float] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    done: bool = False
    truncated: bool = False
    reward: float | None = None
    success: bool | None = None

    def finish(self, step: Step, truncated: bool = False) -> None:
        self.done, self.truncated, self.reward = True, truncated, step.reward
        self.success = step.success if step.success is not None else bool((step.reward or 0.0) > 0)


def _left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
        mask[i, width - len(s) :] = 1
    return ids, mask


def run_episodes(
    generate: Generate,
    tokenizer: Any,
    envs: Sequence[Environment],
    rows: Sequence[Row],
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    max_turns: int | Sequence[int],
    max_tokens: int,
    max_turn_tokens: int = 0,
    eos_token_id: int | Sequence[int],
    pad_token_id: int,
    seed: int | None = None,
    renderer: ObservationRenderer | None = None,
    **sampling: Any,
) -> tuple[dict[str, torch.Tensor], list[list[dict[str, str]]]]:
    """Run one episode per row (left-padded ``prompt_ids``); returns (batch tensors, conversations).

    ``max_turns`` is one limit or one per row; ``max_turn_tokens`` caps one model turn (0: only
    the budget does); a turn cut by it goes to the environment unfinished (``Turn.stopped`` False)
    and the template's end-of-turn text opens the observation. ``sampling``: ``temperature``, ``top_p``, ``top_k``, ``greedy``, passed to every turn. The
    batch holds the engines' keys, with responses padded to ``max_tokens``, plus per-row
    ``agent_*`` statistics (``agent_reward`` is NaN where the environment left scoring to the
    profile's reward) and ``agent_truncated``.
    """
    limits = [max_turns] * len(rows) if isinstance(max_turns, int) else [int(t) for t in max_turns]
    if len(limits) != len(rows) or min(limits, default=1) < 1 or max_tokens < 1:
        raise RunError(
            f"multi-turn rollout needs max_turns >= 1 per row and max_tokens >= 1, got {max_turns}, {max_tokens}"
        )
    renderer = renderer or ObservationRenderer(tokenizer)
    stops = {int(t) for t in torch.tensor(eos_token_id).view(-1).tolist()}
    prompts = [row[m.bool()].tolist() for row, m in zip(prompt_ids, prompt_mask, strict=True)]
    episodes, engine_log_probs = [], True
    for env, row in zip(envs, rows, strict=True):
        env.start(row)
        episodes.append(Episode(env=env, messages=[dict(m) for m in row.get("prompt", [])]))
    for turn in range(max(limits, default=0)):
        active = [i for i, ep in enumerate(episodes) if not ep.done]
        if not active:
            break
        room = [max_tokens - len(episodes[i].ids) for i in active]
        if max_turn_tokens > 0:
            room = [min(r, max_turn_tokens) for r in room]
        ids, mask = _left_pad([prompts[i] + episodes[i].ids for i in active], pad_token_id)
        out = generate(
            ids,
            mask,
            n=1,
            max_new_tokens=max(room),
            eos_token_id=sorted(stops),
            pad_token_id=pad_token_id,
            seed=None if seed is None else seed + 1_000_033 * turn,
            **sampling,
        )
        for k, i in enumerate(active):
            ep = episodes[i]
            keep = out["response_mask"][k].bool()
            toks = out["responses"][k][keep].tolist()[: room[k]]
            ep.ids += toks
            ep.model += [1] * len(toks)
            if "rollout_log_probs" in out:
                ep.log_probs += out["rollout_log_probs"][k][keep].tolist()[: room[k]]
            else:  # an engine whose log-probs are not rlctl's convention reports none
                engine_log_probs = False
                ep.log_probs += [0.0] * len(toks)
            ep.turns += 1
            stopped = bool(toks) and toks[-1] in stops
            text = tokenizer.decode(toks[:-1] if stopped else toks, skip_special_tokens=False)
            ep.messages.append({"role": "assistant", "content": text})
            if not stopped and len(ep.ids) >= max_tokens:  # the budget, not the turn cap, ran out
                ep.finish(ep.env.on_truncated(), truncated=True)
                continue
            parsed = parse_turn(text, turn, stopped)
            step = ep.env.step(parsed)
            ep.tool_calls += max(step.tool_calls, len(parsed.tool_calls) + len(parsed.errors))
            ep.tool_errors += max(step.tool_errors, len(parsed.errors))
            if step.done:
                ep.finish(step)
                continue
            obs = renderer.encode(step.messages, tokenizer.decode(toks[-1:]) if stopped else None)
            if turn == limits[i] - 1 or len(ep.ids) + len(obs) >= max_tokens:
                ep.finish(ep.env.on_truncated(), truncated=True)
                continue
            ep.ids += obs
            ep.model += [0] * len(obs)
            ep.log_probs += [0.0] * len(obs)
            ep.messages += step.messages
    batch = _assemble(prompt_ids, prompt_mask, episodes, max_tokens, pad_token_id)
    if not engine_log_probs:
        del batch["rollout_log_probs"]
    return batch, [ep.messages for ep in episodes]


def _assemble(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, episodes: list[Episode], width: int, pad_id: int
) -> dict[str, torch.Tensor]:
    responses = [(ep.ids, ep.model, ep.log_probs) for ep in episodes]
    batch = response_batch(prompt_ids.cpu().long(), prompt_mask.cpu().long(), responses, width, pad_id)

    return batch | {
        "agent_turns": column([ep.turns for ep in episodes]),
        "agent_tool_calls": column([ep.tool_calls for ep in episodes]),
        "agent_tool_errors": column([ep.tool_errors for ep in episodes]),
        "agent_reward": column([math.nan if ep.reward is None else float(ep.reward) for ep in episodes]),
        "agent_success": column([float(bool(ep.success)) for ep in episodes]),
        "agent_truncated": column([float(ep.truncated) for ep in episodes]),
    }
