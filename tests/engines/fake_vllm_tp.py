"""A vLLM model at tensor-parallel rank ``t`` of ``q``, holding and loading exactly what vLLM 0.10.2,
0.13.0 and 0.33.0 hold per rank (paths inside the wheels; the arithmetic is the same in all three).

- Launch (``LLM(tensor_parallel_size=q, distributed_executor_backend="external_launcher")``):
  ``config/parallel.py`` sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0``; ``v1/executor/uniproc_executor.py``
  ``ExecutorWithExternalLauncher`` takes its rank from ``RANK`` (a KeyError without it); with the
  trainer's process group up, ``distributed/parallel_state.py`` cuts TP groups as
  ``arange(world).reshape(-1, 1, 1, q)`` (a RuntimeError when ``q`` does not divide the world), so
  the TP rank is ``rank % q``. Any other executor at ``q > 1`` would start worker processes: not
  modelled here (the fake raises).
- Parameters per rank, as the layers allocate them (``model_executor/layers/``):
  ``VocabParallelEmbedding`` / ``ParallelLMHead``: ``(pad_vocab_size(vocab, 64) / q, hidden)``
  (a tied LM head is the embedding, ``models/qwen2.py``); ``QKVParallelLinear``:
  ``(heads/q + 2 * kv_per_rank) * head_dim`` rows, ``kv_per_rank = 1`` when ``q >= kv_heads`` (each
  KV head then on ``q / kv_heads`` ranks) else ``kv_heads / q``; ``MergedColumnParallelLinear``
  gate_up ``2 * intermediate/q`` rows; ``RowParallelLinear`` o/down ``(hidden, in/q)``, bias whole;
  norms whole. Unwritten storage is NaN (``torch.empty`` holds whatever the allocator gives).
- ``load_weights`` (``Qwen2Model.load_weights`` / ``LlamaModel.load_weights``): the
  ``stacked_params_mapping`` renames q/k/v and gate/up to the merged parameter with a shard id,
  ``lm_head.`` is skipped when tied, then each parameter's ``weight_loader`` narrows the full HF
  tensor to this rank's rows: :meth:`ShardedModel._qkv`, :meth:`_merged`, :meth:`_row`,
  :meth:`_vocab` transcribe ``linear.py`` and ``vocab_parallel_embedding.py`` (padding rows
  ``fill_(0)`` on every load).
- Generation: the rank's shards are gathered over its TP group into the HF model that samples
  (a test-side stand-in for vLLM's TP forward), so what it samples comes from the shards it holds.
"""

from __future__ import annotations

import os
import types

import torch

STACKED = [  # models/qwen2.py, models/llama.py: (param_name, shard_name, shard_id)
    ("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1),
]  # fmt: skip


def pad_vocab_size(vocab: int, pad_to: int = 64) -> int:
    return ((vocab + pad_to - 1) // pad_to) * pad_to


class ShardedModel:
    """vLLM's ``*ForCausalLM`` at TP rank ``tp_rank`` of ``tp``: ``named_parameters`` and ``load_weights``."""

    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self, config, tp: int, tp_rank: int, dtype: torch.dtype = torch.float32):
        self.config, self.tp, self.tp_rank = config, tp, tp_rank
        h, heads = config.hidden_size, config.num_attention_heads
        kv = getattr(config, "num_key_value_heads", None) or heads
        self.head_dim = getattr(config, "head_dim", None) or h // heads
        assert heads % tp == 0, f"{heads} is not divisible by {tp}"  # vllm.distributed.utils.divide
        self.num_heads = heads // tp
        if tp >= kv:
            assert tp % kv == 0, f"{tp} is not divisible by {kv}"
            self.num_kv_heads, self.num_kv_head_replicas = 1, tp // kv
        else:
            assert kv % tp == 0, f"{kv} is not divisible by {tp}"
            self.num_kv_heads, self.num_kv_head_replicas = kv // tp, 1
        self.inter = config.intermediate_size // tp
        self.vocab = config.vocab_size
        self.per_vocab = pad_vocab_size(self.vocab) // tp
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        bias = bool(getattr(config, "attention_bias", False)) or config.model_type == "qwen2"

        def empty(*shape):
            return torch.full(shape, float("nan"), dtype=dtype)

        p: dict[str, torch.Tensor] = {"model.embed_tokens.weight": empty(self.per_vocab, h)}
        qkv = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        for n in range(config.num_hidden_layers):
            a, m = f"model.layers.{n}.self_attn.", f"model.layers.{n}.mlp."
            p[a + "qkv_proj.weight"] = empty(qkv, h)
            if bias:
                p[a + "qkv_proj.bias"] = empty(qkv)
            p[a + "o_proj.weight"] = empty(h, self.num_heads * self.head_dim)
            p[m + "gate_up_proj.weight"] = empty(2 * self.inter, h)
            p[m + "down_proj.weight"] = empty(h, self.inter)
            p[f"model.layers.{n}.input_layernorm.weight"] = empty(h)
            p[f"model.layers.{n}.post_attention_layernorm.weight"] = empty(h)
        p["model.norm.weight"] = empty(h)
        if not self.tied:
            p["lm_head.weight"] = empty(self.per_vocab, h)
        self.params = p

    # -- what vLLM shows --------------------------------------------------------------------------
    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        yield from self.params.items()  # a tied LM head is the embedding: registered once

    def zero_(self) -> None:
        for t in self.params.values():
            t.zero_()

    # -- weight loaders (model_executor/layers/linear.py, vocab_parallel_embedding.py) -------------
    def _qkv(self, param, loaded, shard_id):  # QKVParallelLinear.weight_loader, output_dim = 0
        q_rows, kv_rows = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        offset, size = {"q": (0, q_rows), "k": (q_rows, kv_rows), "v": (q_rows + kv_rows, kv_rows)}[shard_id]
        shard_rank = self.tp_rank if shard_id == "q" else self.tp_rank // self.num_kv_head_replicas
        param.narrow(0, offset, size).copy_(loaded.narrow(0, shard_rank * size, size))

    def _merged(self, param, loaded, shard_id):  # MergedColumnParallelLinear.weight_loader
        size = self.inter
        param.narrow(0, shard_id * size, size).copy_(loaded.narrow(0, self.tp_rank * size, size))

    def _row(self, param, loaded):  # RowParallelLinear.weight_loader, input_dim = 1
        size = param.shape[1]
        param.copy_(loaded.narrow(1, self.tp_rank * size, size))

    def _vocab(self, param, loaded):  # VocabParallelEmbedding.weight_loader
        assert loaded.shape[0] == self.vocab
        start = self.tp_rank * self.per_vocab
        end = min(start + self.per_vocab, self.vocab)
        shard = loaded.narrow(0, start, max(end - start, 0))
        param[: shard.shape[0]].copy_(shard)
        param[shard.shape[0] :].fill_(0)

    @torch.no_grad()
    def load_weights(self, weights) -> set[str]:
        loaded_names = set()
        for name, tensor in weights:
            if self.tied and name.startswith("lm_head."):
                continue  # AutoWeightsLoader skip_prefixes
            for param_name, shard_name, shard_id in STACKED:
                if f".{shard_name}." not in name:
                    continue
                target = name.replace(shard_name, param_name)
                loader = self._qkv if param_name == "qkv_proj" else self._merged
                loader(self.params[target], tensor, shard_id)
                break
            else:
                target, param = name, self.params[name]
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    self._row(param, tensor)
                elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
                    self._vocab(param, tensor)
                else:
                    assert param.shape == tensor.shape
                    param.copy_(tensor)
            loaded_names.add(target)
        return loaded_names

    # -- test-side stand-in for the TP forward ---------------------------------------------------
    def gathered_hf(self, hf_names: dict[str, tuple[int, ...]], group) -> dict[str, torch.Tensor]:
        """Every HF tensor rebuilt from the TP group's shards (an all_gather per parameter)."""
        import torch.distributed as dist

        gathered = {}
        for name, t in self.params.items():
            parts = [torch.empty_like(t) for _ in range(self.tp)]
            dist.all_gather(parts, t.contiguous(), group=group)
            gathered[name] = parts
        return self.assemble(hf_names, gathered)

    def assemble(self, hf_names, gathered: dict[str, list[torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Every HF tensor from the TP ranks' parameters (``gathered[param]``: one per TP rank)."""
        out = {}
        q_rows, kv_rows = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        kv_ranks = range(0, self.tp, self.num_kv_head_replicas)
        for name in hf_names:
            path, _, leaf = name.rpartition(".")
            sub = path.rpartition(".")[2]
            fused = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
                     "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}.get(sub)  # fmt: skip
            if fused is not None:
                parts = gathered[name.replace(sub, fused)]
                cut = {"q_proj": (0, q_rows), "k_proj": (q_rows, kv_rows), "v_proj": (q_rows + kv_rows, kv_rows),
                       "gate_proj": (0, self.inter), "up_proj": (self.inter, self.inter)}[sub]  # fmt: skip
                ranks = kv_ranks if sub in ("k_proj", "v_proj") else range(self.tp)
                out[name] = torch.cat([parts[r].narrow(0, *cut) for r in ranks])
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                out[name] = torch.cat(gathered[name], dim=1)
            elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
                source = gathered.get(name) or gathered["model.embed_tokens.weight"]
                out[name] = torch.cat(source)[: self.vocab]
            else:
                out[name] = gathered[name][0]
        return out


def tp_worker(args, extension: type, hf, tp: int):
    """The one worker an external-launcher ``LLM`` builds in this process, holding its TP rank's shards."""
    import torch.distributed as dist

    if args.distributed_executor_backend != "external_launcher":
        raise NotImplementedError("fake vLLM: tensor_parallel_size > 1 is modelled with external_launcher only")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # config/parallel.py for external_launcher
    rank = int(os.environ["RANK"])  # ExecutorWithExternalLauncher._distributed_args
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world % tp:
        raise RuntimeError(f"shape '[-1, 1, 1, {tp}]' is invalid for input of size {world}")
    groups = [dist.new_group(list(range(d * tp, (d + 1) * tp))) for d in range(world // tp)]
    config = hf.model.config
    arch = (getattr(config, "architectures", None) or ["Qwen2ForCausalLM"])[0]
    model = type(arch, (ShardedModel,), {})(config, tp, rank % tp, dtype=next(hf.model.parameters()).dtype)
    worker = type("WorkerWithExtension", (extension,), {})()
    worker.model_runner = types.SimpleNamespace(model=model)
    worker.model_config = types.SimpleNamespace(hf_config=config)
    worker.tp_group = groups[rank // tp]
    return worker


def refresh_hf(worker, hf) -> None:
    """Load the TP group's gathered shards into the HF model that samples (every TP rank together)."""
    names = {n: tuple(p.shape) for n, p in hf.model.named_parameters()}
    hf.update_weights(worker.model_runner.model.gathered_hf(names, worker.tp_group).items())


# -- SGLang (0.5.3, 0.5.23): one Engine holds every TP rank's scheduler ---------------------------------
class LocalSerializedTensor:
    """``LocalSerializedTensor`` (0.5.3 ``model_executor/model_runner.py``, 0.5.23
    ``model_runner_components/weight_updater.py``): the i-th value is the i-th TP rank's tensor."""

    def __init__(self, values):
        self.values = values

    def get(self, rank: int):
        return MultiprocessingSerializer.deserialize(self.values[rank])


class MultiprocessingSerializer:
    """``sglang.srt.utils.MultiprocessingSerializer`` stand-in: pickles the tensor itself (the real
    one sends a CUDA IPC handle on a GPU)."""

    @staticmethod
    def serialize(obj, output_str: bool = False):
        import pickle

        return pickle.dumps(obj)

    @staticmethod
    def deserialize(data):
        import pickle

        return pickle.loads(data)


def sglang_schedulers(hf, tp: int) -> list[ShardedModel]:
    """The ``tp`` schedulers ``Engine(tp_size=tp)`` starts, each holding its TP rank's shards."""
    config = hf.model.config
    return [ShardedModel(config, tp, t, dtype=next(hf.model.parameters()).dtype) for t in range(tp)]


def sglang_load(schedulers: list[ShardedModel], named_tensors, hf) -> None:
    """``update_weights_from_tensor`` at TP > 1: every scheduler unwraps its value
    (``_unwrap_tensor``) and loads through its loaders; the sampling HF model is rebuilt from them."""
    for t, model in enumerate(schedulers):
        model.load_weights(
            [(n, v.get(t) if isinstance(v, LocalSerializedTensor) else v) for n, v in named_tensors]
        )
    names = {n: tuple(p.shape) for n, p in hf.model.named_parameters()}
    gathered = {name: [m.params[name] for m in schedulers] for name in schedulers[0].params}
    hf.update_weights(schedulers[0].assemble(names, gathered).items())


def sglang_modules(version: str) -> dict:
    """``sglang.srt.utils`` and the module holding ``LocalSerializedTensor`` in ``version``."""
    utils = types.ModuleType("sglang.srt.utils")
    utils.MultiprocessingSerializer = MultiprocessingSerializer
    where = (
        "sglang.srt.model_executor.model_runner"
        if tuple(int(x) for x in version.split(".")) < (0, 5, 23)
        else "sglang.srt.model_executor.model_runner_components.weight_updater"
    )
    holder = types.ModuleType(where)
    holder.LocalSerializedTensor = LocalSerializedTensor
    return {"sglang.srt.utils": utils, where: holder}
