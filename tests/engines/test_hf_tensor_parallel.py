"""Rollout tensor parallelism on the HF engine: FSDP2 shards -> the engine's TP shards, in place.

Each test spawns gloo ranks that hold a real FSDP2 training engine and a tensor-parallel HF
rollout engine, and runs the loop's own ``PolicyWorker.sync_weights`` between them. The TP
engine starts with uninitialised shards, so everything it computes after the sync comes from the
planned move (layout ``hf_tp``).
"""

from __future__ import annotations

import os
import types

import pytest
import torch

from rlctl.dispatch.local_ranks import spawn_ranks
from rlctl.dispatch.mesh import Mesh
from rlctl.dispatch.worker import WorkerContext
from rlctl.engines.fsdp_train import FSDPTrainEngine
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.engines.numerics import log_prob_tolerance
from rlctl.errors import RunError
from rlctl.profile.schema import ActorSection, RolloutSection
from rlctl.trainer.plan.specs import RolloutSpec
from rlctl.trainer.workers.roles import PolicyWorker
from tests.engines.helpers import EOS, PAD, free_port, make_model


def _worker(world: int, tp: int, order: str, model_dir: str, rank: int) -> PolicyWorker:
    """A policy worker as ``init_model`` builds it, minus the loss and optimiser settings."""
    worker = PolicyWorker.__new__(PolicyWorker)
    worker._rlctl_ctx = WorkerContext(
        role="policy", rank=rank, world_size=world, local_rank=rank, local_world_size=world,
        mesh=Mesh.of(None, world).with_rollout(tp, order), master_addr="127.0.0.1",
        master_port=int(os.environ["MASTER_PORT"]),
    )  # fmt: skip
    worker.spec = types.SimpleNamespace(
        engine=types.SimpleNamespace(mixed_precision=None, dtype="float32"),
        loss=types.SimpleNamespace(actor=ActorSection()),  # no offload: the canary runs in place
        rollout=RolloutSpec(section=RolloutSection(tensor_parallel=tp), rank_order=order),
        lora=None,
    )
    worker.actor = FSDPTrainEngine(model_dir)
    worker.rollout = HFRolloutEngine(model_dir, tensor_parallel_size=tp, rank_order=order)
    return worker


def _train_a_little(actor: FSDPTrainEngine, seed: int) -> None:
    """Move the trainer's weights off the checkpoint's (seeded: every run moves them the same),
    so the sync carries something new."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in actor.model.named_parameters():
            local = p.to_local()
            local.add_(0.01 * torch.randn(local.shape, generator=g, dtype=local.dtype))


def _run(rank: int, world: int, port: int, tp: int, order: str, model_dir: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        worker = _worker(world, tp, order, model_dir, rank)
        first = worker.sync_weights()
        _train_a_little(worker.actor, seed=1000 + rank)
        metrics = worker.sync_weights(step=1)
        replica = worker.mesh.rollout().dp_rank(rank)
        prompts = torch.randint(3, 60, (3, 5), generator=torch.Generator().manual_seed(replica))
        mask = torch.ones_like(prompts)
        kw = {"max_new_tokens": 6, "eos_token_id": EOS, "pad_token_id": PAD}
        greedy = worker.rollout.generate(prompts, mask, greedy=True, **kw)
        sampled = worker.rollout.generate(prompts, mask, n=2, seed=7 + replica, **kw)
        # the trainer's log-probs of the sampled rows (every rank runs its FSDP forward)
        batch = {
            k: sampled[k]
            for k in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
        }
        trainer_lp = worker.actor.compute_log_prob(batch)["log_probs"]
        full = {n: t.full_tensor().detach().clone() for n, t in worker.actor.model.named_parameters()}
        local_bytes = sum(t.numel() * t.element_size() for t in worker.rollout.local_tensors().values())
        # a sync that leaves one shard out must fail the fingerprint, on every rank of the replica
        _train_a_little(worker.actor, seed=2000 + rank)
        os.environ["RLCTL_INJECT_SYNC_SKIP"] = "model.layers.0.mlp.down_proj.weight@2"
        try:
            worker.sync_weights(step=2, skip="model.layers.0.mlp.down_proj.weight")
            stale = None
        except RunError as exc:
            stale = str(exc)
        torch.save(
            {
                "first": first, "metrics": metrics, "greedy": greedy, "sampled": sampled,
                "trainer_lp": trainer_lp, "full": full, "local_bytes": local_bytes, "stale": stale,
                "prompts": prompts, "replica": replica,
            },
            f"{out}.{rank}",
        )  # fmt: skip
    finally:
        dist.destroy_process_group()


def _spawn(tmp_path, world: int, tp: int, order: str, tie: bool) -> list[dict]:
    model_dir = make_model(tmp_path / "m", tie=tie)
    out = str(tmp_path / "out")
    spawn_ranks(_run, world, (world, free_port(), tp, order, str(model_dir), out))
    return [torch.load(f"{out}.{r}", weights_only=False) for r in range(world)]


def _single_engine(full: dict[str, torch.Tensor], model_dir) -> HFRolloutEngine:
    engine = HFRolloutEngine(str(model_dir))
    engine.update_weights(full.items())
    return engine


@pytest.mark.timeout(240)
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_fsdp2_to_tp2_equals_the_trainer_and_tp1(tmp_path, tie):
    results = _spawn(tmp_path, world=2, tp=2, order="contiguous", tie=tie)
    a, b = results
    # both TP ranks of the one replica sampled the same tokens with the same log-probs
    for key in ("responses", "rollout_log_probs"):
        assert torch.equal(a["sampled"][key], b["sampled"][key]), key
    for r in results:
        assert r["first"]["sync/fingerprint_ok"] == 1.0 and r["metrics"]["sync/fingerprint_ok"] == 1.0
        assert r["metrics"]["sync/canary_ok"] == 1.0
        # the engine's sampling log-probs are the trainer's on the same tokens (fp32 parity bound:
        # the mean decides, as engines/numerics says; single tokens may reach its WARN band)
        mask = r["sampled"]["response_mask"].bool()
        tol = log_prob_tolerance(torch.float32, layers=2, hidden=32, seq_len=11)
        gap = (r["sampled"]["rollout_log_probs"] - r["trainer_lp"])[mask].abs()
        assert gap.mean().item() <= tol.passes and gap.max().item() <= tol.warns, (gap, tol)
        # a shard left out of a sync is caught by the fingerprint on every rank of the replica
        assert r["stale"] is not None and "down_proj" in r["stale"]
    # greedy decoding at TP 2 is token for token the single-copy engine's on the same weights
    single = _single_engine(a["full"], tmp_path / "m")
    ref = single.generate(a["prompts"], torch.ones_like(a["prompts"]), greedy=True, max_new_tokens=6,
                          eos_token_id=EOS, pad_token_id=PAD)  # fmt: skip
    assert torch.equal(ref["responses"], a["greedy"]["responses"])
    # each rank stores about half of the model (norms, biases of row-parallel layers whole)
    full_bytes = sum(t.numel() * t.element_size() for n, t in a["full"].items())
    assert a["local_bytes"] <= 0.6 * full_bytes


@pytest.mark.timeout(300)
@pytest.mark.parametrize("order", ["strided", pytest.param("contiguous", marks=pytest.mark.slow)])
def test_four_ranks_dp2_tp2_sync_and_sample_per_replica(tmp_path, order):
    results = _spawn(tmp_path, world=4, tp=2, order=order, tie=False)
    groups = [[0, 1], [2, 3]] if order == "contiguous" else [[0, 2], [1, 3]]
    for i, (x, y) in enumerate(groups):
        assert results[x]["replica"] == results[y]["replica"] == i
        assert torch.equal(results[x]["sampled"]["responses"], results[y]["sampled"]["responses"])
    for r in results:
        assert r["metrics"]["sync/fingerprint_ok"] == 1.0 and r["stale"] is not None
        mask = r["sampled"]["response_mask"].bool()
        assert (r["sampled"]["rollout_log_probs"] - r["trainer_lp"])[mask].abs().max() < 1e-4


def test_a_model_whose_heads_do_not_split_is_refused_by_name():
    from rlctl.reshard.layout import check_hf_tp
    from rlctl.reshard.model import spec_from_config

    smollm2 = {"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9,
               "num_key_value_heads": 3, "intermediate_size": 1536, "num_hidden_layers": 30,
               "vocab_size": 49152, "tie_word_embeddings": True}  # fmt: skip
    spec = spec_from_config(smollm2)
    assert check_hf_tp(spec, 2) == "num_attention_heads=9 is not divisible by tp=2"
    assert check_hf_tp(spec, 3) is None
    assert "num_key_value_heads=2" in check_hf_tp(spec_from_config({**smollm2, "num_key_value_heads": 2,
                                                                      "num_attention_heads": 8}), 4)  # fmt: skip


def test_rollout_tp_needs_an_initialised_group(tmp_path):
    from rlctl.errors import UserError

    with pytest.raises(UserError, match="rollout.tensor_parallel = 2: .*no initialised process group"):
        HFRolloutEngine(str(make_model(tmp_path / "m")), tensor_parallel_size=2)


def test_a_layer_the_engine_cannot_split_is_refused_by_name(tmp_path):
    """An embedding subclass (Gemma-style scaled embeddings compute more in forward) is not
    silently replaced by a plain vocabulary-parallel lookup."""
    from torch import nn

    from rlctl.engines import hf_tp
    from rlctl.errors import UserError

    class ScaledEmbedding(nn.Embedding):
        def forward(self, ids):
            return super().forward(ids) * 2.0

    model = hf_tp.build_meta_model(
        str(make_model(tmp_path / "m")), dtype="float32", trust_remote_code=False, attn_implementation="sdpa"
    )
    old = model.model.embed_tokens
    model.model.embed_tokens = ScaledEmbedding(old.num_embeddings, old.embedding_dim, device="meta")
    with pytest.raises(UserError, match="'model.embed_tokens' is a ScaledEmbedding"):
        hf_tp.apply_plan(model, hf_tp.declared_plan(model), group=None, tp=2, rank=0)
