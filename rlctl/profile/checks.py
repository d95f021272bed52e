"""Cross-field checks that one key's validation alone cannot see."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from rlctl.errors import UserError
from rlctl.profile.schema import Profile

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_profile(profile: Profile, origins: dict[str, Path]) -> None:
    """Raise UserError for the first inconsistency, naming the file and key that set it."""

    def fail(key: str, message: str) -> None:
        raise UserError(f"{origins.get(key, profile.source)}: {key}: {message}")

    if not profile.model.path:
        fail("model.path", "required: a local HF model directory")
    if not RUN_NAME.fullmatch(profile.run.name) or profile.run.name in (".", ".."):
        fail(
            "run.name",
            f"expected a plain name (letters, digits, '.', '_', '-'; no '/' or '..'), got {profile.run.name!r}: "
            "the run directory is run.output_dir/run.name and nothing is written outside it",
        )
    mini = profile.actor.mini_batch_prompts
    if mini and profile.trainer.prompts_per_step % mini:
        fail(
            "actor.mini_batch_prompts",
            f"expected a divisor of trainer.prompts_per_step ({profile.trainer.prompts_per_step}), got {mini}",
        )
    _check_rollout_tp(profile, fail)
    _check_delta_sync(profile, fail)
    _check_partial_rollouts(profile, fail)
    _check_shapes(profile, fail)
    if profile.actor.lora is not None:
        from rlctl.profile.lora_checks import check_lora

        check_lora(profile.actor.lora, profile.model.path, fail)
    if profile.agent.env and profile.agent.openai_agent:
        fail("agent.openai_agent", "set together with agent.env: an episode is played by one of them; unset one")
    if profile.agent.reward != "agent" and not profile.agent.openai_agent:
        fail("agent.reward", f"{profile.agent.reward!r} reads an agent.openai_agent's return value; none is set")
    reward = profile.reward
    if reward.kind == "custom" and ":" not in reward.function:
        fail("reward.function", f"expected 'path/to/file.py:function_name', got {reward.function!r}")
    if reward.kind != "custom" and reward.function:
        fail("reward.function", f"set, but reward.kind is {reward.kind!r} (use kind = 'custom')")
    if reward.kind == "reward_model" and not reward.model_path:
        fail("reward.model_path", "required when reward.kind = 'reward_model'")
    if reward.kind == "code":  # probes this host's sandbox layers (cached): refuse before any work
        from rlctl.rewards.sandbox import require_sandbox

        try:
            require_sandbox(reward.sandbox)
        except UserError as exc:
            fail(
                "reward.sandbox", str(exc).removeprefix("reward.sandbox = ").removeprefix("reward.sandbox: ")
            )
    algo, max_new = profile.algorithm, profile.rollout.max_new_tokens
    if algo.overlong_buffer and algo.overlong_buffer >= max_new:
        fail(
            "algorithm.overlong_buffer",
            f"{algo.overlong_buffer} must be below rollout.max_new_tokens ({max_new}): the penalty ramps "
            f"from max_new_tokens - overlong_buffer, so every response would be penalised (verl's DAPO "
            f"recipe: 4096 of 20480, a fifth)",
        )
    if algo.dynamic_sampling and profile.rollout.n < 2:
        fail(
            "algorithm.dynamic_sampling",
            f"needs rollout.n >= 2 (got {profile.rollout.n}): groups of one are always kept, as verl, "
            "so it would filter nothing",
        )
    if profile.algorithm.adv_estimator == "remax" and profile.rollout.n < 1:
        fail("rollout.n", "remax needs at least one sample per prompt")
    for name in profile.trainer.loggers:
        if name not in ("console", "jsonl", "tensorboard", "wandb"):
            fail("trainer.loggers", f"expected console, jsonl, tensorboard or wandb, got {name!r}")


def _check_rollout_tp(profile: Profile, fail: Callable[[str, str], None]) -> None:
    """Where rollout tensor parallelism runs: the HF, vLLM or SGLang engine colocated with the
    trainer (sync mode; SGLang's replica inside one node), a plain single-turn policy. Each other case is refused naming what stands in the way."""
    tp = profile.rollout.tensor_parallel
    if tp == 1:
        return
    blockers = {
        "rollout.engine": (
            profile.rollout.engine == "sglang" and profile.cluster.devices_per_node % tp != 0,
            f"one SGLang engine drives its replica's {tp} devices, which must sit in one node "
            f"(cluster.devices_per_node = {profile.cluster.devices_per_node})",
        ),
        "trainer.mode": (
            profile.trainer.mode != "sync",
            f"{profile.trainer.mode!r} runs the rollout in workers of its own that take full weights; "
            "tensor-parallel rollout runs colocated, in 'sync' mode",
        ),
        "agent.env": (
            bool(profile.agent.env),
            "multi-turn environments run on every rank; a tensor-parallel replica would run each "
            "episode's tools once per rank",
        ),
        "agent.openai_agent": (
            bool(profile.agent.openai_agent),
            "the agent endpoint runs each episode's agent on every rank; a tensor-parallel replica "
            "would run it once per rank",
        ),
        "actor.lora": (
            profile.actor.lora is not None,
            "a LoRA actor syncs adapter tensors; the tensor-parallel engine takes planned full-weight shards",
        ),
    }
    for key, (blocked, why) in blockers.items():
        if blocked:
            fail(
                key, f"rollout.tensor_parallel = {tp}: {why}; set rollout.tensor_parallel = 1 or change {key}"
            )


def _check_shapes(profile: Profile, fail: Callable[[str, str], None]) -> None:
    """Sizes the workers need to divide, caught before any worker starts.

    Batch sizes need not divide the number of ranks: the update pads each mini-batch with
    masked rows (``rlctl.trainer.step.minibatch``). What must divide is fixed by the model and the
    world: the rollout's tensor-parallel degree against the world size and the attention heads
    (the HF engine's rule, ``rlctl.reshard.layout.check_hf_tp``: query and KV heads both divisible by
    tp, each rank holding whole heads; vLLM's, ``rlctl.engines.tp_shards.why_not``: KV heads split
    or each replicated over ``tp // kv`` ranks).
    """
    c, tp = profile.cluster, profile.rollout.tensor_parallel
    world = c.nodes * c.devices_per_node
    if c.backend == "inprocess" and world > 1:
        fail(
            "cluster.backend",
            f"inprocess runs one process, so it cannot train on cluster.nodes x cluster.devices_per_node = "
            f"{world} ranks; use backend = 'ray' or one device",
        )
    if world % tp:
        fail(
            "rollout.tensor_parallel",
            f"{tp} does not divide the {world} ranks of the cluster (nodes x devices_per_node)",
        )
    heads = _attention_heads(profile.model.path)
    if heads is None or tp == 1:
        return
    q, kv = heads
    if q % tp:
        fail("rollout.tensor_parallel", f"{tp} does not divide the model's num_attention_heads ({q})")
    if profile.rollout.engine in ("vllm", "sglang"):  # both replicate a KV head over tp // kv ranks
        if (tp >= kv and tp % kv) or (tp < kv and kv % tp):
            fail(
                "rollout.tensor_parallel",
                f"{tp} and the model's num_key_value_heads ({kv}): one must divide the other "
                f"({profile.rollout.engine} splits KV heads or replicates each over whole ranks)",
            )
    elif kv % tp:
        fail(
            "rollout.tensor_parallel",
            f"{tp} does not divide the model's num_key_value_heads ({kv}): the HF engine shards whole "
            "KV heads (it cannot replicate them)",
        )


def _attention_heads(model_path: str) -> tuple[int, int] | None:
    """(num_attention_heads, num_key_value_heads) from the model's config.json; None when unreadable
    (a model not downloaded yet is checked when it loads)."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    cfg = cfg.get("text_config") or cfg  # multimodal configs nest the language model's
    q = cfg.get("num_attention_heads")
    if not isinstance(q, int) or q < 1:
        return None
    kv = cfg.get("num_key_value_heads") or q
    return q, int(kv)


def _check_delta_sync(profile: Profile, fail: Callable[[str, str], None]) -> None:
    """Where delta pushes run (the HF engine's in-place apply, whole tensors, no adapter): anything
    else is refused, so the key never sits unread."""
    if not profile.rollout.delta_sync:
        return
    c = profile.cluster
    blockers = {
        "rollout.engine": (
            profile.rollout.engine in ("vllm", "sglang"),
            f"the {profile.rollout.engine!r} engine takes full weights only so far; use rollout.engine = 'hf'",
        ),
        "rollout.tensor_parallel": (profile.rollout.tensor_parallel > 1, "a tensor-parallel engine takes full shards"),
        "actor.lora": (profile.actor.lora is not None, "a LoRA actor already syncs its adapter alone"),
        "cluster.devices_per_node": (
            profile.trainer.mode == "sync" and c.nodes * c.devices_per_node > 1,
            "the multi-rank colocated sync moves planned shards, full; one rank, or an off-policy "
            "trainer.mode (its pushes go from rank 0)",
        ),
    }
    for key, (blocked, why) in blockers.items():
        if blocked:
            fail(key, f"rollout.delta_sync = true: {why}")


def _check_partial_rollouts(profile: Profile, fail: Callable[[str, str], None]) -> None:
    """Where partial rollouts run (the async pipeline's HF rollout workers, in-process or on Ray;
    swaps with full weights): anything else is refused, so the switch never sits unread."""
    mode = profile.trainer.partial_rollouts
    if mode == "off":
        return
    r, swap = profile.rollout, mode == "swap"
    blockers = {
        "trainer.mode": (
            profile.trainer.mode != "async",
            f"needs trainer.mode = 'async', got {profile.trainer.mode!r} (sync generates each batch "
            "with the weights it trains; one_step_off pins each batch to one version)",
        ),
        "rollout.engine": (
            r.engine in ("vllm", "sglang"),
            f"the {r.engine!r} engine's partial rollouts are not wired to the rollout workers yet; use rollout.engine = 'hf'",
        ),
        "rollout.tensor_parallel": (r.tensor_parallel > 1, "every rank would have to stop at the same decode step"),
        "rollout.delta_sync": (swap and r.delta_sync, "a swap loads the full published weights; set one of the two"),
        "actor.lora": (swap and profile.actor.lora is not None, "a swap loads full weights, not an adapter"),
        "algorithm.adv_estimator": (
            not swap and profile.algorithm.adv_estimator == "remax",
            "ReMax's greedy baseline regenerates the prompts drawn, not the carried groups handed out",
        ),
    }
    for key, (blocked, why) in blockers.items():
        if blocked:
            fail(key, f"trainer.partial_rollouts = {mode!r}: {why}")
