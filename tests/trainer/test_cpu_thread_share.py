"""On a CPU host the off-policy modes run the rollout ranks next to the training ranks: the two
sides split the host's cores between them, never taking more threads than it has cores.

Unit-level: the rule both sides call (``workers._cpu_threads``) on the ranks' real contexts,
``os.cpu_count`` set to the host under test and ``torch.set_num_threads`` recorded, not applied.
"""

from __future__ import annotations

import os
import types

import pytest
import torch

from rlctl.dispatch import Mesh
from rlctl.dispatch.worker import WorkerContext
from rlctl.engines.optim import OptimConfig
from rlctl.profile.schema import ActorSection
from rlctl.trainer.plan.specs import ActorLossSpec, EngineSpec, PolicySpec, UpdateSpec, build_specs
from rlctl.trainer.workers import rollout as async_workers
from rlctl.trainer.workers.roles import _cpu_threads
from rlctl.trainer.workers.rollout import RolloutWorker


@pytest.fixture
def host(monkeypatch):
    """``host(cores)`` makes this process look like a host with that many cores; returns the
    thread counts set since."""
    calls: list[int] = []

    def make(cores: int) -> list[int]:
        monkeypatch.setattr(os, "cpu_count", lambda: cores)
        calls.clear()
        return calls

    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    return make


def _rank(role: str, rank: int, local_world: int, in_process: bool = False):
    ctx = WorkerContext(
        role, rank, local_world, rank, local_world, Mesh.of(None, local_world), "127.0.0.1", 0,
        in_process=in_process,
    )  # fmt: skip
    return types.SimpleNamespace(ctx=ctx)


def _split(local_world: int, spec: EngineSpec, in_process: bool = False) -> tuple[list, list]:
    """Threads of every training rank and every rollout rank of one host."""
    train = [_cpu_threads(_rank("policy", r, local_world, in_process), spec) for r in range(local_world)]
    rollout = [
        _cpu_threads(_rank("rollout", r, local_world, in_process), spec, side="rollout")
        for r in range(local_world)
    ]
    return train, rollout


@pytest.mark.parametrize(("cores", "ranks"), [(2, 1), (3, 1), (5, 1), (8, 1), (4, 2), (8, 2), (16, 2)])
def test_training_and_rollout_ranks_together_take_the_hosts_cores(host, cores, ranks):
    set_threads = host(cores)
    spec = EngineSpec(model_path="m", device_type="cpu", separate_rollout=True)
    train, rollout = _split(ranks, spec)
    assert sum(train) + sum(rollout) == cores
    assert len(set(train)) == 1 and len(set(rollout)) == 1  # equal shares within a side
    assert rollout[0] == cores // (2 * ranks)  # the rollout side keeps its half
    assert set_threads == train + rollout  # what was returned is what was set


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_never_more_threads_than_cores_when_the_cores_go_round(host, ranks):
    for cores in range(2 * ranks, 33):
        host(cores)
        train, rollout = _split(ranks, EngineSpec(model_path="m", separate_rollout=True))
        assert cores - ranks < sum(train) + sum(rollout) <= cores
        assert min(train + rollout) >= 1


def test_too_few_cores_still_gives_each_rank_one_thread(host):
    host(2)
    train, rollout = _split(2, EngineSpec(model_path="m", separate_rollout=True))
    assert train == rollout == [1, 1]


def test_sync_mode_in_process_and_accelerators_are_unchanged(host):
    set_threads = host(8)
    assert _split(2, EngineSpec(model_path="m"))[0] == [4, 4]  # no rollout group: the whole host
    shared = EngineSpec(model_path="m", separate_rollout=True)
    assert _split(2, shared, in_process=True) == ([4, 4], [4, 4])  # one process for every rank
    set_threads.clear()
    cuda = EngineSpec(model_path="m", device_type="cuda", separate_rollout=True)
    assert _split(1, cuda) == ([None], [None]) and set_threads == []
    with pytest.raises(ValueError, match="side"):
        _cpu_threads(_rank("policy", 0, 1), shared, side="ref")


def _profile(tmp_path, mode: str):
    from rlctl.profile import load_profile

    path = tmp_path / f"{mode}.toml"
    path.write_text(
        f"""
[model]
path = "{tmp_path}"
[algorithm]
preset = "ppo"
[actor]
use_kl_loss = true
[trainer]
mode = "{mode}"
"""
    )
    return load_profile(path)


@pytest.mark.parametrize(("mode", "separate"), [("sync", False), ("one_step_off", True), ("async", True)])
def test_every_role_of_the_training_process_knows_a_rollout_group_shares_the_host(tmp_path, mode, separate):
    """Policy, reference and critic run in one process and each sets its threads: all must agree."""
    specs = build_specs(
        _profile(tmp_path, mode), device_type="cpu", dtype="float32", attn="sdpa", dist_backend="gloo"
    )
    engines = [specs.policy.engine, specs.ref.engine, specs.critic.engine]
    assert [e.separate_rollout for e in engines] == [separate] * 3


def test_the_rollout_worker_sets_its_half_through_the_shared_rule(host, monkeypatch):
    set_threads = host(8)
    monkeypatch.setattr(async_workers, "rollout_engine", lambda spec: "engine")
    spec = PolicySpec(
        engine=EngineSpec(model_path="m", separate_rollout=True),
        optim=OptimConfig(lr=1e-3),
        loss=ActorLossSpec(ActorSection(skip_zero_advantage=False)),
        update=UpdateSpec(),
    )
    for rank in range(2):
        worker = RolloutWorker.__new__(RolloutWorker)
        worker._rlctl_ctx = _rank("rollout", rank, 2).ctx
        worker.__init__(spec=spec)
        worker.init_model()
        assert worker.rollout == "engine"
    train = [_cpu_threads(_rank("policy", r, 2), spec.engine) for r in range(2)]
    assert set_threads[:2] == [2, 2] and train == [2, 2]


def _model(tmp_path, hidden: int):
    path = tmp_path / f"h{hidden}"
    path.mkdir()
    (path / "config.json").write_text(f'{{"model_type": "llama", "hidden_size": {hidden}}}')
    return str(path)


def test_platform_cpu_threads_is_taken_as_given(host, tmp_path):
    from dataclasses import replace

    set_threads = host(8)
    spec = EngineSpec(model_path=_model(tmp_path, 128), device_type="cpu", separate_rollout=True, cpu_threads=3)
    assert _split(1, spec) == ([3], [3]) and set_threads == [3, 3]
    assert _split(1, replace(spec, device_type="cuda")) == ([None], [None])


def test_the_profile_key_reaches_every_role(tmp_path):
    from rlctl.profile import load_profile

    path = tmp_path / "p.toml"
    path.write_text(f'[model]\npath = "{tmp_path}"\n[platform]\ncpu_threads = 1\n')
    specs = build_specs(load_profile(path), device_type="cpu", dtype="float32", attn="sdpa", dist_backend="gloo")
    assert specs.policy.engine.cpu_threads == 1
