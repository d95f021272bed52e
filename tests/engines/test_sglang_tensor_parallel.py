"""SGLang at rollout tensor parallelism 2, against fakes of 0.5.3 and 0.5.23 whose ``Engine(tp_size=2)``
holds one scheduler per TP rank, each loading as the real loaders do (``tests/engines/fake_vllm_tp.py``).

Two gloo ranks, FSDP 2 -> one SGLang replica of TP 2: the engine lives on rank 0, rank 1 feeds it its
full tensors as ``LocalSerializedTensor`` values; both ranks return the replica's generations.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from rlctl.dispatch.local_ranks import spawn_ranks
from tests.engines.helpers import EOS, PAD, free_port, make_model, tp2_policy_worker
from tests.engines.test_vllm_tensor_parallel import _reference

SGLANG_TP_VERSIONS = ("0.5.3", "0.5.23")


def _install_fake_sglang(version: str, root: str) -> list:
    from tests.engines.fakes import install_dist, make_fake_sglang

    install_dist(Path(root), "sglang", version)
    sys.path.insert(0, root)
    calls: list = []
    sys.modules.update(make_fake_sglang(calls, version))
    return calls


def _run(rank: int, world: int, port: int, version: str, model_dir: str, out: str) -> None:
    import torch.distributed as dist

    from rlctl.engines.sglang_rollout import SGLangRolloutEngine
    from rlctl.errors import RunError

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world))  # fmt: skip
    calls = _install_fake_sglang(version, f"{out}.site{rank}")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        worker = tp2_policy_worker(
            rank, world, port, model_dir,
            SGLangRolloutEngine(model_dir, device="cpu", dtype="float32", tensor_parallel_size=2),
        )  # fmt: skip
        worker.rollout.sleep()
        worker.rollout.wake()
        metrics = worker.sync_weights(step=1)
        full = {n: t.full_tensor().detach().clone() for n, t in worker.actor.model.named_parameters()}
        engine = worker.rollout.engine
        held = None if engine is None else [{n: t.clone() for n, t in m.params.items()} for m in engine.schedulers]
        prompts = torch.randint(3, 60, (2, 5), generator=torch.Generator().manual_seed(0))
        greedy = worker.rollout.generate(prompts, torch.ones_like(prompts), greedy=True, max_new_tokens=5,
                                         eos_token_id=EOS, pad_token_id=PAD)  # fmt: skip
        scores = worker.rollout.prompt_log_probs(prompts[0].tolist())
        # SGLang has no weight read (no fingerprint): a tensor left out is the canary's to catch
        skipped = "model.layers.0.mlp.down_proj.weight"
        with torch.no_grad():
            dict(worker.actor.model.named_parameters())[skipped].to_local().mul_(-3.0)
        try:
            worker.sync_weights(step=2, skip=skipped)
            stale = None
        except RunError as exc:
            stale = str(exc)
        torch.save({"metrics": metrics, "stale": stale, "full": full, "held": held, "greedy": greedy, "prompts": prompts, "scores": scores,
                    "calls": [c[0] for c in calls], "engine_kwargs": next((c[1] for c in calls if c[0] == "Engine"), None)},
                   f"{out}.{rank}")  # fmt: skip
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("version", SGLANG_TP_VERSIONS)
def test_fsdp2_to_sglang_tp2_in_the_loop(tmp_path, version):
    from rlctl.engines.hf_rollout import HFRolloutEngine

    model_dir = make_model(tmp_path / "m", vocab_size=100)
    out = str(tmp_path / "out")
    spawn_ranks(_run, 2, (2, free_port(), version, str(model_dir), out))
    leader, other = (torch.load(f"{out}.{r}", weights_only=False) for r in range(2))
    for r in (leader, other):
        assert r["metrics"]["sync/canary_ok"] == 1.0, r["metrics"]
        assert r["stale"] is not None and "canary" in r["stale"], r["stale"]
    # one engine for the replica, on its first rank, driving two TP schedulers from device 0 on
    assert leader["engine_kwargs"]["tp_size"] == 2 and leader["engine_kwargs"]["base_gpu_id"] == 0
    assert leader["engine_kwargs"]["gpu_id_step"] == 1  # schedulers on the ranks' devices 0 and 1
    assert other["engine_kwargs"] is None and other["held"] is None
    assert "update_weights_from_tensor" in leader["calls"] and "update_weights_from_tensor" not in other["calls"]
    # each scheduler holds what SGLang's loaders keep of the trainer's full weights
    config = AutoConfig.from_pretrained(model_dir)
    for t, held in enumerate(leader["held"]):
        want = _reference(config, leader["full"], 2, t)
        assert sorted(held) == sorted(want)
        for name, tensor in want.items():
            assert torch.equal(held[name], tensor), (t, name)
    # both ranks return the replica's answer, which is the single-copy engine's on the same weights
    assert torch.equal(leader["greedy"]["responses"], other["greedy"]["responses"])
    assert torch.equal(leader["scores"], other["scores"])
    single = HFRolloutEngine(str(model_dir))
    single.update_weights(leader["full"].items())
    ref = single.generate(leader["prompts"], torch.ones_like(leader["prompts"]), greedy=True,
                          max_new_tokens=5, eos_token_id=EOS, pad_token_id=PAD)  # fmt: skip
    assert torch.equal(ref["responses"], leader["greedy"]["responses"])


def test_sglang_tp_needs_the_trainers_process_group(tmp_path, monkeypatch):
    from rlctl.engines.sglang_rollout import SGLangRolloutEngine
    from rlctl.errors import UserError
    from tests.engines.fakes import install

    install(monkeypatch, tmp_path, "sglang", "0.5.23", [])
    with pytest.raises(UserError, match=r"^rollout\.tensor_parallel = 2 with rollout\.engine = 'sglang': no initialised"):
        SGLangRolloutEngine(str(make_model(tmp_path / "m")), device="cpu", tensor_parallel_size=2)


@pytest.mark.parametrize(
    ("devices", "found"),
    [([0, 1], (0, 1)), ([2, 3], (2, 1)), ([1, 3, 5, 7], (1, 2)), ([4], (4, 1)),
     ([1, 0], None), ([0, 1, 3], None), ([2, 2], None)],
)  # fmt: skip
def test_replica_devices_as_base_gpu_id_and_step(devices, found):
    from rlctl.engines.sglang_tp import progression

    assert progression(devices) == found


def _replica(monkeypatch, ranks: list[tuple[str, list[str]]]):
    """``replica_gpu_ids`` of a replica at global ranks 4.. whose ranks report ``ranks`` (each
    rank's device and the devices it sees): the gather is the one thing faked."""
    import torch.distributed as dist

    from rlctl.engines.sglang_tp import replica_gpu_ids

    def gather(out, _mine, group=None):
        out[:] = ranks

    monkeypatch.setattr(dist, "all_gather_object", gather)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: len(ranks))
    monkeypatch.setattr(dist, "get_global_rank", lambda group, i: 4 + i)
    monkeypatch.setattr("rlctl.engines.sglang_tp.own_device", lambda: ranks[0])
    return replica_gpu_ids(object(), "where")


def test_replica_gpu_ids_address_the_ranks_devices_as_the_first_rank_sees_them(monkeypatch):
    node = ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]
    # second replica of a node seen whole: devices 2 and 3
    assert _replica(monkeypatch, [("GPU-c", node), ("GPU-d", node)]) == (2, 1)
    # every other device (a pool whose bundles landed so): base 0, step 2
    assert _replica(monkeypatch, [("GPU-a", node), ("GPU-c", node)]) == (0, 2)


def test_replica_gpu_ids_refuse_devices_the_engine_cannot_address(monkeypatch):
    from rlctl.errors import UserError

    node = ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]
    with pytest.raises(UserError, match=r"^where: the replica's devices \[3, 1\] \(indices among those its first rank sees: GPU-d, GPU-b\) are not"):
        _replica(monkeypatch, [("GPU-d", node), ("GPU-b", node)])
    # Ray's default narrowing: each rank sees only its own device
    with pytest.raises(UserError, match=r"^where: the replica's first rank does not see rank 5's device GPU-b \(it sees 1"):
        _replica(monkeypatch, [("GPU-a", ["GPU-a"]), ("GPU-b", ["GPU-b"])])


def test_sglang_tp_asks_the_pool_for_the_node_devices(tmp_path):
    """SGLang at TP > 1 drives its replica from one rank, so its pool leaves the node's devices
    visible; at TP 1, and for the engines where every rank holds its own piece, it does not."""
    from rlctl.profile.schema import RolloutSection
    from rlctl.trainer.plan.specs import RolloutSpec
    from rlctl.trainer.workers.rollout_engines import needs_node_devices

    model = str(make_model(tmp_path / "m"))

    def spec(engine: str, tp: int, vendor: str = "nvidia"):
        return types.SimpleNamespace(
            engine=types.SimpleNamespace(model_path=model, device_type="cuda"),
            rollout=RolloutSpec(engine=engine, section=RolloutSection(tensor_parallel=tp), vendor=vendor),
        )

    assert needs_node_devices(spec("sglang", 2)) and needs_node_devices(spec("sglang", 4, "rocm"))
    assert not needs_node_devices(spec("sglang", 1))
    assert not needs_node_devices(spec("vllm", 2))  # each rank is one vLLM worker on its own device
