"""Sharded loading (meta construction, per-rank shard reads) against the full load, over gloo."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from rlctl.dispatch.local_ranks import spawn_ranks
from tests.engines.helpers import free_port, make_model

WORLD_SIZES = (1, 2)


def _make_uneven(path: Path) -> Path:
    """A Qwen2 whose dim 0 does not split evenly over 2 ranks (vocab 67, intermediate 45)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(7)
    cfg = Qwen2Config(
        vocab_size=67,
        hidden_size=36,
        intermediate_size=45,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.save_pretrained(str(path))
    return path


def _drop_tensor(src: Path, dst: Path, name: str) -> Path:
    """A copy of ``src`` whose safetensors file lacks ``name``."""
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    for f in ("config.json", "generation_config.json"):
        if (src / f).is_file():
            (dst / f).write_bytes((src / f).read_bytes())
    state = load_file(str(src / "model.safetensors"))
    del state[name]
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    base = tmp_path_factory.mktemp("load")
    uneven = _make_uneven(base / "uneven")
    tied = make_model(base / "tied_src", tie=True, seed=3)
    # the tied model as a sharded safetensors set (model.safetensors.index.json + several files)
    AutoModelForCausalLM.from_pretrained(tied).save_pretrained(str(base / "tied"), max_shard_size="20KB")
    # a critic directory with its own value head
    critic = base / "critic"
    AutoModelForCausalLM.from_pretrained(uneven).save_pretrained(str(critic))
    torch.manual_seed(11)
    torch.save({"weight": torch.randn(1, 36), "bias": torch.randn(1)}, critic / "value_head.pt")
    # not safetensors (transformers 5 always saves safetensors, so write the .bin by hand): the
    # rank-0 load + broadcast fallback
    (base / "bin").mkdir()
    (base / "bin" / "config.json").write_bytes((uneven / "config.json").read_bytes())
    torch.save(AutoModelForCausalLM.from_pretrained(uneven).state_dict(), base / "bin" / "pytorch_model.bin")
    missing = _drop_tensor(uneven, base / "missing", "lm_head.weight")
    return {
        "uneven": str(uneven),
        "tied": str(base / "tied"),
        "critic": str(critic),
        "bin": str(base / "bin"),
        "missing": str(missing),
        "base": base,
    }


CASES = [  # (name, model key, engine kwargs)
    ("uneven_fp32", "uneven", {}),
    ("uneven_bf16_storage", "uneven", {"dtype": "bfloat16"}),
    ("tied_index", "tied", {}),
    ("critic_fresh_head", "uneven", {"value_head": True}),
    ("critic_saved_head", "critic", {"value_head": True, "mixed_precision": "bfloat16"}),
    ("bin_fallback", "bin", {}),
]


ONE_RANK_CASES = ("uneven_fp32", "tied_index", "critic_saved_head", "bin_fallback")  # the rest split dim 0


def _snapshot(model) -> dict[str, torch.Tensor]:
    from rlctl.engines import fsdp_io

    out = {k: v.clone() for k, v in fsdp_io.export_weights(model, "full")}
    out.update({f"buffer:{k}": v.clone() for k, v in model.named_buffers()})
    return out


def _eager(path: str, kwargs: dict, mesh):
    """The previous path: every rank loads the whole model, then shards it."""
    from rlctl.engines.fsdp_train import _shard
    from rlctl.engines.hf_model import load_causal_lm, load_value_model
    from rlctl.engines.mixed_precision import compute_dtype

    loader = load_value_model if kwargs.get("value_head") else load_causal_lm
    model = loader(path, dtype=kwargs.get("dtype", "float32"))
    comp = compute_dtype(kwargs.get("dtype", "float32"), kwargs.get("mixed_precision"))
    _shard(model, mesh, comp, False, "cpu")
    return model


def _worker(rank: int, world: int, port: int, models: dict, out_dir: str) -> None:
    import torch.distributed as dist

    import rlctl.engines.fsdp_load as fsdp_load
    from rlctl.engines.fsdp_train import FSDPTrainEngine
    from rlctl.errors import UserError

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    eager_calls = []
    real_loader = fsdp_load.load_causal_lm
    fsdp_load.load_causal_lm = lambda *a, **k: eager_calls.append(a[0]) or real_loader(*a, **k)
    try:
        result: dict = {"cases": {}}
        for name, key, kwargs in CASES:
            if world == 1 and name not in ONE_RANK_CASES:
                continue
            torch.manual_seed(5)  # the trainer seeds every rank alike before building an engine
            engine = FSDPTrainEngine(models[key], **kwargs)
            got = _snapshot(engine.model)
            local_rows = {
                n: (p.to_local().shape[0] if p.dim() else -1) for n, p in engine.model.named_parameters()
            }
            torch.manual_seed(5)
            want = _snapshot(_eager(models[key], kwargs, engine.mesh))
            result["cases"][name] = {
                "keys_equal": got.keys() == want.keys(),
                "differ": [k for k in want if k in got and not torch.equal(got[k], want[k])],
                "dtypes": {k: str(v.dtype) for k, v in got.items()},
                "local_rows": local_rows,
            }
        result["eager_calls"] = list(eager_calls)
        try:
            FSDPTrainEngine(models["missing"])
            result["missing_error"] = None
        except UserError as exc:
            result["missing_error"] = str(exc)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(models):
    out = {}
    for world in WORLD_SIZES:
        out_dir = models["base"] / f"w{world}"
        out_dir.mkdir()
        spawn_ranks(_worker, world, (world, free_port(), models, str(out_dir)))
        out[world] = [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world)]
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", WORLD_SIZES)
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_sharded_load_is_bit_exact_with_the_full_load(runs, world, case):
    if world == 1 and case not in ONE_RANK_CASES:
        pytest.skip("covered by the 2-rank run")
    for r in runs[world]:
        res = r["cases"][case]
        assert res["keys_equal"]
        assert res["differ"] == []


@pytest.mark.timeout(240)
def test_rotary_buffers_are_real_after_meta_construction(runs):
    res = runs[2][0]["cases"]["uneven_fp32"]
    assert "buffer:model.rotary_emb.inv_freq" in res["dtypes"]
    assert res["dtypes"]["buffer:model.rotary_emb.inv_freq"] == "torch.float32"
    assert res["differ"] == []  # buffers are compared too


@pytest.mark.timeout(240)
def test_uneven_split_gives_short_and_empty_shards(runs):
    rows0 = runs[2][0]["cases"]["critic_fresh_head"]["local_rows"]
    rows1 = runs[2][1]["cases"]["critic_fresh_head"]["local_rows"]
    assert (rows0["backbone.embed_tokens.weight"], rows1["backbone.embed_tokens.weight"]) == (34, 33)
    assert (
        rows0["backbone.layers.0.mlp.gate_proj.weight"],
        rows1["backbone.layers.0.mlp.gate_proj.weight"],
    ) == (
        23,
        22,
    )
    assert (rows0["value_head.weight"], rows1["value_head.weight"]) == (1, 0)


@pytest.mark.timeout(240)
def test_storage_dtype_and_value_head_dtype(runs):
    for r in runs[2]:
        assert r["cases"]["uneven_bf16_storage"]["dtypes"]["lm_head.weight"] == "torch.bfloat16"
        saved = r["cases"]["critic_saved_head"]["dtypes"]
        assert saved["value_head.weight"] == saved["backbone.embed_tokens.weight"] == "torch.float32"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_only_rank0_loads_the_whole_model_and_only_for_non_safetensors(runs, models, world):
    assert runs[world][0]["eager_calls"] == [models["bin"]]
    for r in runs[world][1:]:
        assert r["eager_calls"] == []


@pytest.mark.timeout(240)
def test_a_parameter_missing_from_the_checkpoint_is_named(runs):
    for r in runs[2]:
        assert r["missing_error"] and "'lm_head.weight'" in r["missing_error"]


def test_reader_matches_safetensors_slices(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    from rlctl.engines.fsdp_load import SafetensorsRows

    tensors = {
        "a": torch.randn(7, 3).to(torch.bfloat16),
        "b": torch.randn(5),
        "c": torch.tensor(3.5, dtype=torch.float16),
        "d": torch.arange(12, dtype=torch.int64).reshape(4, 3),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    reader = SafetensorsRows(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        for key in tensors:
            shape = reader.shape(key)
            for start, stop in ((0, shape[0] if shape else 0), (1, 3), (4, 4)):
                if not shape and (start, stop) != (0, 0):
                    continue
                want = f.get_slice(key)[start:stop] if shape else f.get_tensor(key)
                got = reader.rows(key, start, stop)
                assert got.dtype == want.dtype and torch.equal(got, want), (key, start, stop)
    index = {"weight_map": {"a": "model.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "b" in SafetensorsRows(tmp_path)  # every tensor of the indexed files is found


# -- host memory of a 2-rank load ------------------------------------------------------------------


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _measure(load) -> dict:
    """Peak RSS increase (bytes) over the current RSS while ``load()`` runs, and its local shard bytes."""
    import gc

    import torch.distributed as dist

    gc.collect()
    dist.barrier()
    exact = _reset_peak()
    base = _status_kb("VmRSS") if exact else _status_kb("VmHWM")
    model = load()
    peak = _status_kb("VmHWM")
    local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    dist.barrier()
    return {"increase": (peak - base) * 1024, "local_bytes": local, "exact": exact}


def _rss_worker(rank: int, world: int, port: int, model_dir: str, warm_dir: str, out_dir: str) -> None:
    import torch.distributed as dist

    from rlctl.engines.fsdp_train import FSDPTrainEngine, _shard
    from rlctl.engines.hf_model import load_causal_lm

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_mesh(world)
        warm = FSDPTrainEngine(warm_dir)  # imports and first-use costs out of the measurement
        del warm

        def old():  # what the engine did before: the whole model on every rank, then fully_shard
            model = load_causal_lm(model_dir)
            _shard(model, mesh, None, False, "cpu")
            return model

        # the sharded load first, in a process that has never held the big model
        result = {"new": _measure(lambda: FSDPTrainEngine(model_dir).model), "old": _measure(old)}
        torch.save(result, os.path.join(out_dir, f"rss{rank}.pt"))
    finally:
        dist.destroy_process_group()


def init_mesh(world: int):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))


@pytest.fixture(scope="module")
def rss(tmp_path_factory):
    """Peak RSS increase per rank of a 2-rank load of a ~72 MB model, new path and old path."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    base = tmp_path_factory.mktemp("rss")
    cfg = Qwen2Config(
        vocab_size=32768,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    model.save_pretrained(str(base / "big"))
    del model
    warm = make_model(base / "warm")
    spawn_ranks(_rss_worker, 2, (2, free_port(), str(base / "big"), str(warm), str(base)))
    ranks = [torch.load(base / f"rss{r}.pt") for r in range(2)]
    return {"model_bytes": model_bytes, "new": [r["new"] for r in ranks], "old": [r["old"] for r in ranks]}


@pytest.mark.timeout(240)
def test_two_rank_load_keeps_each_rank_near_one_shard(rss):
    limit = 0.75 * rss["model_bytes"]
    for r in rss["new"]:
        assert r["local_bytes"] <= 0.51 * rss["model_bytes"]
        assert r["increase"] < limit, (r["increase"], rss["model_bytes"])
    # the previous load (every rank reads the whole model, then shards) does not: the test can fail
    for r in rss["old"]:
        assert r["increase"] > limit, (r["increase"], rss["model_bytes"])
