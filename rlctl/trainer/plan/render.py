"""A RunPlan as plain text lines (``rlctl plan``, ``rlctl doctor --profile``)."""

from __future__ import annotations

from typing import Any

from rlctl.trainer.plan.run_plan import RunPlan


def _g(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}"


def plan_lines(plan: RunPlan) -> list[str]:
    """Header, roles, per-device memory, weight sync, then one PASS/FAIL line per check."""
    d = plan.device
    lines = [
        f"plan for {plan.profile} on {plan.target}",
        f"platform {plan.platform} ({plan.platform_reason})",
        f"devices {plan.nodes} node(s) x {plan.devices_per_node} {d.name} ({d.memory_gib:g} GiB each), "
        f"backend {plan.dist_backend}, Ray resource {plan.ray_resource}, device {plan.device_type}, "
        f"dtype {plan.dtype}",
    ]
    if plan.env:
        lines.append("env " + " ".join(f"{k}={v}" for k, v in sorted(plan.env.items())))
    lines.append("roles:")
    for r in plan.roles.values():
        versions = ", ".join(f"{k} {v}" for k, v in r.versions.items() if v) or "versions not known here"
        kwargs = ", ".join(f"{k}={v!r}" for k, v in r.settings.engine_kwargs.items()) or "none"
        lines.append(
            f"  {r.role:<8} engine {r.engine:<7} kernel {r.kernel or 'engine default'} "
            f"({r.settings.reason}); keywords {kwargs}; {versions}"
        )
        if r.settings.env:
            lines.append("           env " + " ".join(f"{k}={v}" for k, v in sorted(r.settings.env.items())))
        bad = [p for p in r.pins if p.details["status"] == "violated"]
        if r.pins:
            lines.append(f"           pins: {len(r.pins) - len(bad)} ok or n/a, {len(bad)} violated")
    if plan.model is not None:
        m = plan.model
        lines.append(
            f"model {f'{m.params / 1e9:.2f}B' if m.params >= 1e9 else f'{m.params / 1e6:.1f}M'} params, {m.num_layers} layers, hidden {m.hidden_size}, "
            f"heads {m.num_heads}/{m.num_kv_heads} KV, vocab {m.vocab_size} ({m.source})"
        )
    lines += memory_lines(plan.memory)
    lines.append("checks:")
    lines += [f"  {c.line()}" for c in plan.checks]
    n_fail = len(plan.failures)
    lines.append(f"verdict: {'FAIL' if n_fail else 'PASS'} ({n_fail} failing check(s))")
    return lines


def memory_lines(memory: dict[str, Any]) -> list[str]:
    """The per-device memory table (GiB)."""
    if not memory:
        return []
    roles = memory["roles"]
    out = [f"memory per device (GiB; device {_g(memory['device_gib'])}):"]
    a = roles["policy"]
    out.append(
        f"  policy   weights {_g(a['weights_gib'])}  grads {_g(a['grads_gib'])}  optimizer "
        f"{_g(a['optimizer_gib'])}  gathered {_g(a['gathered_gib'])}  logits {_g(a['logits_gib'])}"
    )
    out.append(
        f"           activations at {a['micro_batch_tokens']} tokens/micro-batch: "
        f"{_g(a['activations_no_checkpointing_gib'])} without checkpointing, "
        f"{_g(a['activations_checkpointing_gib'])} with (this run: "
        f"{'with' if a['checkpointing'] else 'without'}); peak {_g(a['peak_gib'])}"
    )
    if "critic" in roles:
        c = roles["critic"]
        out.append(
            f"  critic   state {_g(c['state_gib'])}  activations {_g(c['activations_gib'])}  peak {_g(c['peak_gib'])}"
        )
    if "ref" in roles:
        out.append(f"  ref      weights {_g(roles['ref']['weights_gib'])}")
    r = roles["rollout"]
    key = r.get("length_key", "max_model_len")
    kv = (
        f"KV budget {_g(r['kv_budget_gib'])}, {r['sequences_at_max_len']} sequence(s) at {key}"
        if r["kv_budget_gib"] is not None
        else f"KV for the step's sequences {_g(r['kv_step_gib'])}"
    )
    out.append(
        f"  rollout  {r['engine']}: weights {_g(r['weights_gib'])}, held while awake "
        f"{_g(r['reserved_gib'])}; {kv}; {key} {r['max_model_len']} needs "
        f"{_g(r['kv_per_max_len_sequence_gib'])} per sequence"
    )
    s = memory["weight_sync"]
    secs = "-" if s["seconds"] is None else f"{s['seconds'] * 1000:.1f} ms"
    link = f" at {s['link_gb_s']:g} GB/s" if s["link_gb_s"] else ""
    lora = f" (LoRA: {s['lora']})" if s.get("lora") else ""
    out.append(f"  sync     {_g(s['bytes_gib'])} per update{lora}, {s['path']}{link}: {secs}")
    base = memory.get("cpu_worker_baseline_gib")
    out.append(
        f"  peak     training {_g(memory['train_phase_gib'])}, generating {_g(memory['rollout_phase_gib'])}"
        + (f" (incl. {base:g} GiB process baseline)" if base else "")
        + f" -> predicted {_g(memory['predicted_peak_gib'])}; measured as {memory['measured_as']}"
    )
    return out
