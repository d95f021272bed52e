"""The plan's memory table and its PASS/FAIL checks: divisibility, memory fit, KV cache fit, pins.

Each check is one line with the fix; ``rlctl train`` refuses a plan with any FAIL before a worker
starts. The KV rules are each engine's own, on its own length key (:mod:`.kv_rules`: vLLM's
``max_model_len``, SGLang's ``context_length``).
"""

from __future__ import annotations

from typing import Any

from rlctl.errors import UserError
from rlctl.profile.schema import Profile
from rlctl.trainer.plan import memory as mem
from rlctl.trainer.plan.kv_rules import engine_length, kv_checks
from rlctl.trainer.plan.rollout_tp import moved_per_rank, rollout_rank_order
from rlctl.trainer.plan.shape import model_shape
from rlctl.verdict import FAIL, PASS, WARN, Check

GIB = mem.GIB


def _gib(n: float | int | None) -> str:
    return "n/a" if n is None else f"{n / GIB:.2f} GiB"


def p_order(profile: Profile) -> str:
    """The rollout TP groups' order and the reason, as the plan prints it."""
    order, why = rollout_rank_order(profile)
    return why if why.startswith(order) else f"{order} ({why})"


def fit_checks(profile: Profile, plan: Any, verdicts: list[Check]) -> None:
    """Fill a ``RunPlan``'s ``model``, ``memory`` and ``checks`` from its platform, devices and roles
    (``plan`` is typed loosely: ``run_plan`` imports this module)."""
    p, checks = profile, plan.checks
    shape = model_shape(p.model.path, f"{p.source}: model.path")
    plan.model = shape
    world, tp = plan.world, p.rollout.tensor_parallel
    seq_len = p.data.max_prompt_length + p.rollout.max_new_tokens
    rows = p.trainer.prompts_per_step * p.rollout.n
    rows_per_rank = -(-rows // world)
    rollout = plan.roles["rollout"]

    def check(name: str, ok: bool, detail: str, fix: str) -> None:
        checks.append(Check(name, PASS if ok else FAIL, detail, "" if ok else fix))

    # ---- divisibility
    check(
        "ranks / rollout.tensor_parallel",
        world % tp == 0,
        f"{world} rank(s), tensor-parallel {tp}",
        f"set rollout.tensor_parallel to a divisor of {world}",
    )
    q, kv = shape.num_heads, shape.num_kv_heads
    hf = rollout.engine == "hf"
    # the HF engine shards whole heads (rlctl.reshard.layout.check_hf_tp); vLLM also replicates KV heads
    heads_ok = q % tp == 0 and (
        kv % tp == 0 if hf else (tp >= kv and tp % kv == 0) or (tp < kv and kv % tp == 0)
    )
    why = None
    if tp > 1 and rollout.engine in ("vllm", "sglang"):  # their layers' divide() asserts, all of them
        from rlctl.engines.tp_shards import Heads, why_not

        why = why_not(Heads(q, kv, shape.intermediate_size, shape.vocab_size), tp)
        heads_ok = why is None
    check(
        "attention heads / tensor_parallel",
        heads_ok,
        f"{q} query and {kv} KV heads over tensor-parallel {tp}" + (f": {why}" if why else ""),
        "a tensor-parallel degree dividing the query and the KV heads"
        if hf
        else "a tensor-parallel degree dividing the query heads, the MLP width and the padded vocabulary, "
        "with KV heads a multiple or divisor of it",
    )
    if tp > 1:
        runs = rollout.engine in ("hf", "vllm", "sglang")
        kv_note = f", each KV head on {tp // kv} ranks" if not hf and tp > kv and heads_ok else ""
        check(
            "rollout engine / tensor_parallel",
            runs,
            f"{rollout.engine} at tensor-parallel {tp}{kv_note}"
            + (f", TP groups {p_order(p)}" if runs and world % tp == 0 and heads_ok else ""),
            f"rollout.engine = 'hf', 'vllm' or 'sglang' (the {rollout.engine} adapter runs tensor-parallel 1) "
            "or rollout.tensor_parallel = 1",
        )
    padded = rows_per_rank * world - rows
    # batches need not divide the ranks: the driver pads with masked rows (trainer.step.minibatch)
    check(
        "batch / ranks",
        True,
        f"{rows} sequences per step over {world} rank(s): {rows_per_rank} per rank"
        + (f" ({padded} masked padding rows)" if padded else ""),
        "",
    )
    mini = p.actor.mini_batch_prompts
    check(
        "mini-batches / step",
        not mini or p.trainer.prompts_per_step % mini == 0,
        f"{p.trainer.prompts_per_step} prompts per step, mini-batch {mini or 'whole step'}",
        "actor.mini_batch_prompts dividing trainer.prompts_per_step",
    )

    # ---- memory
    lo = p.actor.lora
    lora_trainable = (
        shape.lora_params(lo.rank, lo.target_modules, lo.modules_to_save) if lo is not None else None
    )
    mini_rows = -(-(mini or p.trainer.prompts_per_step) * p.rollout.n // world)  # one update's rows per rank
    actor = mem.training_memory(
        shape,
        world=world,
        batch_rows=mini_rows,
        compute_dtype=plan.dtype,
        micro_batch_sequences=p.actor.micro_batch_sequences,
        micro_batch_tokens=p.actor.micro_batch_tokens,
        seq_len=seq_len,
        response_len=p.rollout.max_new_tokens,
        checkpointing=p.actor.activation_checkpointing,
        group_size=p.rollout.n,
        temperature=p.rollout.temperature,
        trainable=lora_trainable,
    )
    resident = (
        0
        if (p.actor.param_offload or p.actor.optimizer_offload) and plan.device_type != "cpu"
        else actor.state
    )
    roles_mem: dict[str, Any] = {"policy": mem.as_gib_dict(actor)}
    transient = actor.gathered + actor.activations + actor.logits
    if "critic" in plan.roles:
        critic = mem.training_memory(
            shape,
            world=world,
            batch_rows=mini_rows,
            compute_dtype=plan.dtype,
            micro_batch_sequences=p.critic.micro_batch_sequences,
            micro_batch_tokens=p.critic.micro_batch_tokens,
            seq_len=seq_len,
            response_len=p.rollout.max_new_tokens,
            checkpointing=p.actor.activation_checkpointing,
            value_head=True,
        )
        roles_mem["critic"] = mem.as_gib_dict(critic)
        resident += critic.state
        transient = max(transient, critic.gathered + critic.activations)
    if "ref" in plan.roles:
        ref_weights = -(-shape.params // world) * mem.DTYPE_BYTES.get(plan.dtype, 4)
        roles_mem["ref"] = {"weights_gib": mem.to_gib(ref_weights)}
        resident += ref_weights
    model_max = shape.max_position_embeddings or seq_len
    max_len, len_key, len_source = engine_length(rollout.engine, p.rollout.engine_kwargs, model_max)
    ro = mem.rollout_memory(
        shape,
        engine=rollout.engine,
        dtype=rollout.dtype,
        tp=tp,
        gpu_memory_utilization=p.rollout.gpu_memory_utilization,
        device_bytes=plan.device.memory_bytes,
        max_model_len=max_len,
        rows_per_rank=rows_per_rank,
        seq_len=seq_len,
    )
    roles_mem["rollout"] = {**mem.as_gib_dict(ro), "max_model_len_source": len_source, "length_key": len_key}
    lora_sync = lora_sync_mode(plan, rollout.engine) if lora_trainable is not None else None
    sync = mem.sync_memory(
        shape,
        dtype=rollout.dtype,
        world=world,
        link_gb_s=plan.device.link_gb_s,
        hbm_gb_s=plan.device.hbm_gb_s,
        params=lora_trainable if lora_sync == "adapter-only" else None,
        tp=1 if rollout.engine == "sglang" else tp,  # SGLang's TP ranks each take full tensors
        moved_per_rank=moved_per_rank(p, world, tp, rollout.dtype) if tp > 1 and heads_ok else None,
    )
    cpu = plan.device_type == "cpu"
    # on CPU every rank of a node is a process sharing the host's RAM
    device_bytes = plan.device.memory_bytes // (plan.devices_per_node if cpu else 1)
    baseline = int(mem.CPU_WORKER_BASELINE_GIB * GIB) if cpu else 0
    if ro.engine in ("vllm", "sglang"):
        rollout_phase = resident + ro.reserved
        awake = ro.reserved
    else:  # HF: its own copy of the weights stays; its KV and logits come and go
        rollout_phase = resident + ro.reserved
        awake = ro.weights
        if lora_trainable is not None and world == 1 and rollout.dtype == "float32":
            # one rank, same dtype: the engine's frozen base is the trainer's own (engines.lora)
            shared = ro.weights - lora_trainable * 4
            rollout_phase, awake = rollout_phase - shared, awake - shared
    train_phase = resident + awake + transient if cpu or ro.engine == "hf" else resident + transient
    peak = baseline + max(train_phase, rollout_phase)
    plan.memory = {
        "per_device": True,
        "device_gib": plan.device.memory_gib,
        "roles": roles_mem,
        "weight_sync": {**mem.as_gib_dict(sync), "seconds": sync.seconds, "lora": lora_sync},
        "lora_trainable_params": lora_trainable,
        "cpu_worker_baseline_gib": mem.CPU_WORKER_BASELINE_GIB if cpu else None,
        "train_phase_gib": mem.to_gib(baseline + train_phase),
        "rollout_phase_gib": mem.to_gib(baseline + rollout_phase),
        "predicted_peak_gib": mem.to_gib(peak),
        "measured_as": "memory/policy_peak_gib: host RSS peak of the worker process (all colocated roles)"
        if cpu
        else "memory/policy_peak_gib: allocator peak (max_memory_allocated)",
    }
    where = "this host's RAM" if cpu else f"{plan.device.name} memory"
    check(
        "training fits",
        device_bytes <= 0 or baseline + train_phase <= device_bytes,
        f"{_gib(baseline + train_phase)} of {_gib(device_bytes)} {where} while training "
        f"(activations {_gib(actor.activations_no_checkpointing)} without checkpointing, "
        f"{_gib(actor.activations_checkpointing)} with; this run: "
        f"{'with' if actor.checkpointing else 'without'})",
        ("" if actor.checkpointing else "actor.activation_checkpointing = true, ")
        + "a smaller actor.micro_batch_sequences / micro_batch_tokens, more devices, or "
        "actor.param_offload / optimizer_offload",
    )
    check(
        "rollout fits",
        device_bytes <= 0 or baseline + rollout_phase <= device_bytes,
        f"{_gib(baseline + rollout_phase)} of {_gib(device_bytes)} {where} while generating "
        f"(training state {_gib(resident)} resident, rollout {_gib(ro.reserved)})",
        "a lower rollout.gpu_memory_utilization, actor.param_offload / optimizer_offload, or more devices",
    )
    if ro.kv_budget is not None:
        check(
            "KV cache budget",
            ro.kv_budget > 0,
            f"gpu_memory_utilization {p.rollout.gpu_memory_utilization} x {_gib(device_bytes)} leaves "
            f"{_gib(ro.kv_budget)} for KV after weights {_gib(ro.weights)} and activations",
            "raise rollout.gpu_memory_utilization or use rollout.tensor_parallel > 1",
        )
        for rule in kv_checks(
            rollout.engine,
            kv_budget=ro.kv_budget,
            kv_per_token=ro.kv_bytes_per_token,
            kv_per_max_len_sequence=ro.kv_per_max_len_sequence,
            sequences_at_max_len=ro.sequences_at_max_len,
            length=max_len,
            key=len_key,
            source=len_source,
            model_max=model_max,
            prompt_len=p.data.max_prompt_length,
            seq_len=seq_len,
            gib=_gib,
        ):
            check(*rule)
    # SGLang caps max_new_tokens at max_req_len - prompt - 1 with max_req_len = context_length - 1
    # (0.5.23 managers/scheduler.py, managers/tp_worker.py): prompt + response <= context_length - 2
    usable = max_len - 2 if rollout.engine == "sglang" else max_len
    check(
        f"{len_key} covers prompt + response",
        usable >= seq_len,
        f"{len_key} {max_len}{' - 2' if usable < max_len else ''} >= "
        f"{p.data.max_prompt_length} + {p.rollout.max_new_tokens}",
        f"{len_key} of at least {seq_len + max_len - usable}, or a shorter data.max_prompt_length / rollout.max_new_tokens",
    )
    # ---- pins (this host only; a target's versions are unknown)
    for v in verdicts:
        if v.details["status"] != "violated":
            continue
        used = any(v in r.pins for r in plan.roles.values())
        name = f"pin {v.details['id']}"
        if v.blocks and used:
            checks.append(Check(name, FAIL, v.reason, v.fix))
        else:
            why = "a package this run does not use" if not used else "warn severity"
            checks.append(Check(name, WARN, f"{v.reason} (not blocking: {why})", v.fix))


def lora_sync_mode(plan: Any, engine: str) -> str:
    """How a LoRA actor's weights reach ``engine``: ``adapter-only`` where the engine class holds
    base + adapter (``adapter_sync``), else ``merged`` (the full model's bytes every step)."""
    from rlctl.engines.registry import get_engine

    try:
        cls = get_engine("rollout", "*", engine, plan.device_type, plan.platform)
    except UserError:
        return "merged"
    return "adapter-only" if getattr(cls, "adapter_sync", False) else "merged"
