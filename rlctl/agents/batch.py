"""Run a DataProto of prompt rows as episodes on one rank (what the policy worker's
``generate_episodes`` calls), and the agent settings that travel with the request.

The request's ``meta["agent"]`` (:func:`agent_meta`) names the environment, its base directory,
the turn limit and the tokenizer; the worker builds the tokenizer, renderer and environment
factory once per setting and reuses them. Rows come from the request's non-tensor columns in
verl's layout; ``extra_info.tools_kwargs`` / ``extra_info.interaction_kwargs`` are lifted out as
verl's RL dataset does (verl/utils/dataset/rl_dataset.py).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from rlctl.agents.loader import load_agent_function, load_environment, turns_for_row
from rlctl.agents.render import ObservationRenderer
from rlctl.agents.rollout import run_episodes
from rlctl.dispatch import DataProto

ROW_COLUMNS = ("raw_prompt", "data_source", "ground_truth", "extra_info")
CONVERSATION = "conversation"  # non-tensor column: each episode's messages as JSON
ANSWER = "agent_answer"  # non-tensor column: an OpenAI-client agent's returned final answer


def agent_meta(
    env: str,
    *,
    base_dir: str,
    max_turns: int,
    tokenizer_path: str,
    max_turn_tokens: int = 0,
    trust_remote_code: bool = False,
    openai_agent: str = "",
    gather_s: float = 0.0,
    reward: str = "agent",
) -> dict[str, Any]:
    """The picklable agent settings a generation request carries (``openai_agent``: the user's
    agent function played through the endpoint, instead of the environment ``env``; ``reward``:
    how its return value is read, :mod:`.outcome`)."""
    return {
        "env": env,
        "openai_agent": openai_agent,
        "reward": reward,
        "gather_s": float(gather_s),
        "base_dir": base_dir,
        "max_turns": int(max_turns),
        "max_turn_tokens": int(max_turn_tokens),
        "tokenizer": tokenizer_path,
        "trust_remote_code": bool(trust_remote_code),
    }


@functools.lru_cache(maxsize=4)
def _tools_for(tokenizer_path: str, trust_remote_code: bool) -> tuple[Any, ObservationRenderer]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, trust_remote_code=trust_remote_code)
    return tokenizer, ObservationRenderer(tokenizer)


@functools.lru_cache(maxsize=4)
def _agent_fn(spec: str, base_dir: str) -> Callable[..., Any]:
    return load_agent_function(spec, base_dir)


@functools.lru_cache(maxsize=4)
def _factory(env: str, base_dir: str):
    return load_environment(env, base_dir)


def episode_rows(batch: DataProto) -> list[dict[str, Any]]:
    """Each row as an environment sees it (see :mod:`rlctl.agents.env`)."""
    nt = batch.non_tensor
    rows = []
    for i in range(len(batch)):
        extra = dict(nt["extra_info"][i] or {}) if "extra_info" in nt else {}
        rows.append(
            {
                "prompt": list(nt["raw_prompt"][i]) if "raw_prompt" in nt else [],
                "data_source": nt["data_source"][i] if "data_source" in nt else "",
                "ground_truth": nt["ground_truth"][i] if "ground_truth" in nt else None,
                "extra_info": extra,
                "tools_kwargs": extra.get("tools_kwargs") or {},
                "interaction_kwargs": extra.get("interaction_kwargs") or {},
                "agent_name": extra.get("agent_name"),
            }
        )
    return rows


def generate_episodes(generate: Callable[..., Any], request: DataProto, *, seed: int | None) -> DataProto:
    """One episode per row of ``request`` (input_ids, attention_mask, the row columns, and the
    sampling + ``agent`` meta of a generation request); returns the rollout batch, host tensors,
    with each episode's conversation as JSON in the ``conversation`` column."""
    meta = request.meta
    agent = meta["agent"]
    tokenizer, renderer = _tools_for(agent["tokenizer"], agent["trust_remote_code"])
    if agent.get("openai_agent"):
        return _endpoint_episodes(generate, request, tokenizer, seed=seed)
    factory = _factory(agent["env"], agent["base_dir"])
    rows = episode_rows(request)
    env_name = getattr(factory, "name", agent["env"])
    tensors, conversations = run_episodes(
        generate,
        tokenizer,
        [factory() for _ in rows],
        rows,
        request.batch["input_ids"],
        request.batch["attention_mask"],
        max_turns=[turns_for_row(r["extra_info"], env_name, agent["max_turns"]) for r in rows],
        max_tokens=int(meta["max_new_tokens"]),
        max_turn_tokens=int(agent.get("max_turn_tokens", 0)),
        eos_token_id=meta["eos_token_id"],
        pad_token_id=int(meta["pad_token_id"]),
        seed=seed,
        renderer=renderer,
        temperature=float(meta.get("temperature", 1.0)),
        top_p=float(meta.get("top_p", 1.0)),
        top_k=int(meta.get("top_k", 0)),
        greedy=bool(meta.get("greedy", False)),
    )
    return DataProto.from_dict(
        tensors=tensors, non_tensors={CONVERSATION: [json.dumps(c) for c in conversations]}
    )


def _endpoint_episodes(
    generate: Callable[..., Any], request: DataProto, tokenizer: Any, *, seed: int | None
) -> DataProto:
    """The user's OpenAI-client agent on every row, through this rank's endpoint (:mod:`.endpoint`)."""
    from rlctl.agents.endpoint import EndpointRollout

    meta, agent = request.meta, request.meta["agent"]
    rows = episode_rows(request)
    eos = meta["eos_token_id"]
    rollout = EndpointRollout(
        generate,
        tokenizer,
        _agent_fn(agent["openai_agent"], agent["base_dir"]),
        rows,
        request.batch["input_ids"],
        request.batch["attention_mask"],
        max_turns=[agent["max_turns"]] * len(rows),
        max_tokens=int(meta["max_new_tokens"]),
        max_turn_tokens=int(agent.get("max_turn_tokens", 0)),
        eos_token_id=[int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])],
        pad_token_id=int(meta["pad_token_id"]),
        seed=seed,
        sampling={
            "temperature": float(meta.get("temperature", 1.0)),
            "top_p": float(meta.get("top_p", 1.0)),
            "top_k": int(meta.get("top_k", 0)),
            "greedy": bool(meta.get("greedy", False)),
        },
        gather_s=float(agent.get("gather_s", 0.0)) or None,
        reward_mode=str(agent.get("reward", "agent")),
    )
    tensors = rollout.run()
    return DataProto.from_dict(
        tensors=tensors,
        non_tensors={
            CONVERSATION: [json.dumps(c) for c in rollout.conversations()],
            ANSWER: rollout.answers(),
        },
    )
