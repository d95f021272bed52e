"""Each role's engine takes its micro-batches from its own profile section: the actor's from
``[actor]``, the critic's from ``[critic]``, the reference's from ``[ref]`` (a LoRA actor that
serves the reference reads ``[ref]`` too); activation checkpointing and offload are the actor's
for every role. The engine spec holds none of them."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from rlctl.profile import load_profile
from rlctl.trainer.plan.run_plan import resolve_plan
from rlctl.trainer.plan.specs import EngineSpec
from rlctl.trainer.workers import roles

REPO = Path(__file__).resolve().parents[2]
KEYS = [
    "algorithm.preset=ppo",
    "actor.use_kl_loss=true",
    "actor.micro_batch_sequences=7",
    "actor.micro_batch_tokens=128",
    "critic.micro_batch_sequences=6",
    "critic.micro_batch_tokens=96",
    "ref.micro_batch_sequences=5",
    "ref.micro_batch_tokens=64",
    "actor.activation_checkpointing=true",
    "actor.optimizer_offload=true",
]


class _Worker:
    world_size = 1


def _built_with(monkeypatch, engine: EngineSpec, section, actor) -> dict:
    seen: dict = {}

    class Recorder:
        def __init__(self, path, **kw):
            seen.update(kw)

    monkeypatch.setattr(roles, "get_engine", lambda *a: Recorder)
    # off CPU no threads are set; the recorder loads nothing, so no device is touched
    roles._train_engine(_Worker(), EngineSpec(model_path=engine.model_path, device_type="cuda"), section, actor)
    return seen


def test_each_role_spec_holds_its_own_section_and_its_engine_uses_its_micro_batches(monkeypatch):
    profile = load_profile(str(REPO / "profiles/tiny-cpu.toml"), KEYS)
    plan = resolve_plan(profile)
    policy, critic, ref = (plan.roles[r].spec for r in ("policy", "critic", "ref"))
    assert ref.section is profile.ref and critic.section is profile.critic
    assert policy.loss.actor is profile.actor
    assert ref.actor is profile.actor and critic.actor is profile.actor
    moved = {"micro_batch_sequences", "micro_batch_tokens", "activation_checkpointing", "offload"}
    assert not moved & {f.name for f in fields(EngineSpec)}
    got = {
        "policy": _built_with(monkeypatch, policy.engine, policy.loss.actor, policy.loss.actor),
        "critic": _built_with(monkeypatch, critic.engine, critic.section, critic.actor),
        "ref": _built_with(monkeypatch, ref.engine, ref.section, ref.actor),
    }
    # the reference and the critic take the actor's checkpointing and offload, as they always have
    assert {r: (kw["activation_checkpointing"], kw["cpu_offload"]) for r, kw in got.items()} == {
        r: (True, True) for r in got
    }
    assert {r: (kw["micro_batch_size"], kw["micro_batch_tokens"]) for r, kw in got.items()} == {
        "policy": (7, 128),
        "critic": (6, 96),
        "ref": (5, 64),
    }
    written = plan.to_dict()["roles"]
    assert written["ref"]["spec"]["section"]["micro_batch_tokens"] == 64
    assert "micro_batch_sequences" not in written["ref"]["spec"]["engine"]


def test_a_lora_actor_serving_the_reference_holds_the_ref_section():
    profile = load_profile(
        str(REPO / "profiles/tiny-cpu.toml"),
        ["actor.use_kl_loss=true", "actor.lora.rank=4", "ref.micro_batch_sequences=3"],
    )
    plan = resolve_plan(profile)
    policy = plan.roles["policy"].spec
    assert policy.serves_reference and "ref" not in plan.roles
    assert policy.ref is profile.ref and policy.ref.micro_batch_sequences == 3
