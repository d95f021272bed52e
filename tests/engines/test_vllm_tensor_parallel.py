"""vLLM at rollout tensor parallelism 2 and 4, against fakes of 0.10.2, 0.13.0 and 0.33.0 whose ranks hold
and load shards as the real weight loaders do (``tests/engines/fake_vllm_tp.py``).

The reference for every rank is the fake's ``load_weights`` fed the full HF tensors (what vLLM's
loaders keep of them); the planner's ``vllm`` layout and the engine's fingerprint arithmetic
(``rlctl/engines/tp_shards.py``) are checked against it.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
from transformers import AutoConfig

from rlctl.dispatch.local_ranks import spawn_ranks
from rlctl.engines import tp_shards
from rlctl.reshard import train_to_rollout_plan
from rlctl.reshard.baselines import fsdp_shard
from rlctl.reshard.loopback import collect_all_ranks
from tests.engines.fake_vllm_tp import ShardedModel
from tests.engines.helpers import EOS, PAD, free_port, make_model, tp2_policy_worker

VLLM_TP_VERSIONS = ("0.10.2", "0.13.0", "0.33.0")  # the floor rlctl pins and two later releases


def _full(config, seed: int = 0) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    return {n: p.detach().clone().normal_() for n, p in model.named_parameters()}


def _reference(config, full, tp: int, t: int) -> dict[str, torch.Tensor]:
    model = ShardedModel(config, tp, t)
    model.load_weights(full.items())
    return model.params


CASES = [  # (train ranks, tp, tied, vocab): padding rows at vocab 100; KV heads replicated at tp 4
    (2, 2, False, 100), (2, 2, True, 100), (4, 2, False, 64), (4, 4, False, 100), (4, 4, True, 100),
]  # fmt: skip


@pytest.mark.parametrize(("p", "q", "tie", "vocab"), CASES)
def test_planned_vllm_shards_equal_what_the_loaders_keep(tmp_path, p, q, tie, vocab):
    config = AutoConfig.from_pretrained(make_model(tmp_path / "m", tie=tie, vocab_size=vocab))
    full = _full(config)
    plan = train_to_rollout_plan(config, p, q, fmt="vllm", dtype=torch.float32)
    sources = [{n: fsdp_shard(t, p, r) for n, t in full.items()} for r in range(plan.world)]
    got = collect_all_ranks(plan, sources, torch.float32)
    for r in range(plan.world):
        want = _reference(config, full, q, r % q)
        assert sorted(got[r]) == sorted(want), r
        for name, tensor in want.items():
            assert not tensor.isnan().any(), f"the loader left {name} unwritten"
            assert torch.equal(got[r][name], tensor), (r, name)


@pytest.mark.parametrize(("q", "tie"), [(2, False), (4, True)])
def test_fingerprint_views_read_the_rows_the_loaders_wrote(tmp_path, q, tie):
    """``tp_shards`` (the engine side) names, for every HF tensor, the rows of a vLLM parameter that
    hold it: read back they are the full tensor's slice, and a replicated KV head counts once."""
    config = AutoConfig.from_pretrained(make_model(tmp_path / "m", tie=tie, vocab_size=100))
    full = _full(config)
    heads = tp_shards.Heads.of(config)
    spec = [(n, tuple(t.shape)) for n, t in full.items() if not (tie and n == "lm_head.weight")]
    counted: dict[str, int] = {}
    for t in range(q):
        views, splits = tp_shards.views(spec, _reference(config, full, q, t), heads, q, t)
        for name, _ in spec:
            view, split = views[name], splits.get(name)
            if split is None:
                assert torch.equal(view, full[name]), name
                continue
            held = full[name].narrow(split.dim, split.start, view.shape[split.dim])
            assert torch.equal(view, held), (t, name)
            counted[name] = counted.get(name, 0) + view.shape[split.dim]
    for name, n in counted.items():  # every row or column exactly once over the TP group
        assert n == full[name].shape[splits_dim(name)], name


def splits_dim(name: str) -> int:
    return 1 if name.endswith(("o_proj.weight", "down_proj.weight")) else 0


@pytest.mark.parametrize(("q", "tie"), [(2, False), (4, True)])
def test_the_bench_checks_its_bytes_against_the_loaders(tmp_path, q, tie):
    """``rlctl bench reshard`` checks every moved byte against ``reshard/verify.vllm_shard``: that
    reference is what the fake's loaders keep, rank by rank."""
    from rlctl.reshard.verify import vllm_shard

    config = AutoConfig.from_pretrained(make_model(tmp_path / "m", tie=tie, vocab_size=100))
    full = _full(config)
    for t in range(q):
        want = _reference(config, full, q, t)
        got = vllm_shard(full, config.to_dict(), t, q)
        assert sorted(got) == sorted(want)
        assert all(torch.equal(got[n], want[n]) for n in want)


def test_impossible_splits_are_named():
    heads = tp_shards.Heads(num_heads=9, num_kv_heads=3, intermediate=1536, vocab=49152)
    assert tp_shards.why_not(heads, 2) == "2 does not divide the model's num_attention_heads (9)"
    assert tp_shards.why_not(heads, 3) is None
    qwen72 = tp_shards.Heads(num_heads=64, num_kv_heads=8, intermediate=29568, vocab=152064)
    assert tp_shards.why_not(qwen72, 8) is None and tp_shards.why_not(qwen72, 16) is None  # 2 ranks per KV head
    assert "num_key_value_heads (8)" in tp_shards.why_not(tp_shards.Heads(48, 8, 4096, 64), 12)


# -- the engine in the loop: 2 gloo ranks, FSDP 2 -> vLLM TP 2 ----------------------------------------
def _install_fake_vllm(version: str, root: str) -> None:
    from tests.engines.fakes import install_dist, make_fake_vllm

    install_dist(__import__("pathlib").Path(root), "vllm", version)
    sys.path.insert(0, root)
    vllm = make_fake_vllm([], version)
    sys.modules["vllm"] = vllm
    for name in ("vllm.lora", "vllm.lora.request", "vllm.v1", "vllm.v1.engine", "vllm.v1.engine.llm_engine"):
        sys.modules[name] = vllm.submodules.get(name)


def _run(rank: int, world: int, port: int, version: str, model_dir: str, out: str) -> None:
    import torch.distributed as dist

    from rlctl.engines.vllm_rollout import VLLMRolloutEngine
    from rlctl.errors import RunError

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank))
    _install_fake_vllm(version, f"{out}.site{rank}")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        worker = tp2_policy_worker(
            rank, world, port, model_dir,
            VLLMRolloutEngine(model_dir, device="cpu", dtype="float32", tensor_parallel_size=2),
        )  # fmt: skip
        metrics = worker.sync_weights(step=1)
        full = {n: t.full_tensor().detach().clone() for n, t in worker.actor.model.named_parameters()}
        held = {n: t.clone() for n, t in worker.rollout.local_tensors().items()}
        prompts = torch.randint(3, 60, (2, 5), generator=torch.Generator().manual_seed(0))
        greedy = worker.rollout.generate(prompts, torch.ones_like(prompts), greedy=True, max_new_tokens=5,
                                         eos_token_id=EOS, pad_token_id=PAD)  # fmt: skip
        with torch.no_grad():
            for _, p in worker.actor.model.named_parameters():
                p.to_local().add_(0.01)
        try:
            worker.sync_weights(step=2, skip="model.layers.0.mlp.down_proj.weight")
            stale = None
        except RunError as exc:
            stale = str(exc)
        torch.save({"metrics": metrics, "full": full, "held": held, "greedy": greedy, "prompts": prompts,
                    "stale": stale}, f"{out}.{rank}")  # fmt: skip
    finally:
        dist.destroy_process_group()


# 0.10.2 launches, groups and loads as 0.13.0 does (read in both wheels): its in-loop run is slow, beside 0.13.0's
IN_LOOP_VERSIONS = [pytest.param(v, marks=pytest.mark.slow) if v == "0.10.2" else v for v in VLLM_TP_VERSIONS]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("version", IN_LOOP_VERSIONS)
def test_fsdp2_to_vllm_tp2_in_the_loop(tmp_path, version):
    from rlctl.engines.hf_rollout import HFRolloutEngine

    model_dir = make_model(tmp_path / "m", vocab_size=100)
    out = str(tmp_path / "out")
    spawn_ranks(_run, 2, (2, free_port(), version, str(model_dir), out))
    results = [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]
    config = AutoConfig.from_pretrained(model_dir)
    for t, r in enumerate(results):
        assert r["metrics"]["sync/fingerprint_ok"] == 1.0 and r["metrics"]["sync/canary_ok"] == 1.0
        want = _reference(config, r["full"], 2, t)  # what vLLM's loaders would keep of the full weights
        assert sorted(r["held"]) == sorted(want)
        for name, tensor in want.items():
            assert torch.equal(r["held"][name], tensor), (t, name)
        assert r["stale"] is not None and "model.layers.0.mlp.down_proj.weight" in r["stale"], r["stale"]
        # each rank stores about half the model (norms whole, vocab padded)
        stored = sum(x.numel() for x in r["held"].values())
        assert stored <= 0.6 * sum(x.numel() for x in r["full"].values())
    assert torch.equal(results[0]["greedy"]["responses"], results[1]["greedy"]["responses"])
    single = HFRolloutEngine(str(model_dir))
    single.update_weights(results[0]["full"].items())
    ref = single.generate(results[0]["prompts"], torch.ones_like(results[0]["prompts"]), greedy=True,
                          max_new_tokens=5, eos_token_id=EOS, pad_token_id=PAD)  # fmt: skip
    assert torch.equal(ref["responses"], results[0]["greedy"]["responses"])


def test_vllm_at_tp1_reports_no_stored_shards(tmp_path, monkeypatch):
    """``memory/rollout_weights_gib`` is left out for vLLM at TP 1 (it holds its weights to itself),
    not reported as 0."""
    from rlctl.engines.vllm_rollout import VLLMRolloutEngine
    from rlctl.trainer.workers.planned_sync import stored_gib
    from tests.engines.fakes import install

    install(monkeypatch, tmp_path, "vllm", "0.33.0", [])
    engine = VLLMRolloutEngine(str(make_model(tmp_path / "m")), device="cpu", dtype="float32")
    assert engine.local_tensors() == {} and stored_gib(engine) is None


def test_vllm_tp_local_rank_is_the_ranks_own_device(monkeypatch):
    """vLLM's external launcher puts its worker on ``cuda:LOCAL_RANK`` (``v1/worker/gpu_worker.py``):
    the rank's own device among those it sees (3 on a node seen whole, as under a pool that leaves
    the node's devices visible), not its local rank."""
    import torch.distributed as dist

    from rlctl.engines.vllm_tp import launcher_kwargs

    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    kw = launcher_kwargs(2, "contiguous", ["distributed_executor_backend"], "0.13.0")
    assert kw["distributed_executor_backend"] == "external_launcher"
    assert os.environ["LOCAL_RANK"] == "3" and os.environ["RANK"] == "1"
