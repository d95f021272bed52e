"""Per-device memory of a run, from the model's shape and the profile's batch settings.

Training (the FSDP2 actor, critic): fp32 master weights, fp32 gradients and AdamW's two fp32
moments, each sharded over the ``world`` ranks; the compute-dtype copy of the blocks FSDP gathers
(one block and the prefetched next); the activations one micro-batch keeps for backward, with and
without activation checkpointing; the response logits (:func:`logits_bytes`: the compute-dtype
logits and their gradient; fp32 only chunk by chunk).
Rollout: the weights in the rollout dtype, then the KV cache: vLLM/SGLang reserve
``gpu_memory_utilization`` of the device and keep for KV what weights and activations leave;
the HF engine allocates the step's KV as it goes. Weight sync: the rollout copy's bytes over the
device's link. Sequence lengths are the profile's bounds (``data.max_prompt_length`` +
``rollout.max_new_tokens``), so activations and KV are upper bounds.

On CPU the policy worker's peak resident set also holds the Python/torch/Ray baseline
(:data:`CPU_WORKER_BASELINE_GIB`, measured) and the rollout engine's own fp32 copy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from rlctl.trainer.plan.shape import ModelShape

GIB = float(1 << 30)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# The peak resident set of an idle CPU policy worker process on Linux: Python 3.11, torch 2.13
# (CPU), transformers 5 and the Ray core worker imported, torch's thread pools started, no model.
# Measured with `python -m rlctl.bench.worker_baseline` (a Ray actor importing the worker stack
# and reporting its VmHWM): 0.42 GiB on the 2-core x86-64 host the README's figures come from.
CPU_WORKER_BASELINE_GIB = 0.42

# rlctl.engines.logprob.CHUNK_ELEMENTS (the plan does not import the engines: it runs without torch)
LOGPROB_CHUNK_ELEMENTS = 1 << 20
# vLLM's own default KV block (vllm/config/cache.py, 0.33: block_size 16): its KV check rounds
# max_model_len up to whole blocks.
VLLM_BLOCK_SIZE = 16
# Activations vLLM's memory profile reserves beside the weights (its dummy forward at
# max_num_batched_tokens; 8192 tokens by default in 0.33 V1) are estimated from the model's
# width; CUDA/HIP graphs and the runtime take roughly this much more.
ENGINE_RUNTIME_BYTES = 1 << 30


def activation_bytes_per_token_layer(shape: ModelShape, dtype_bytes: int) -> int:
    """What one decoder layer keeps for backward per token (transformers' Llama/Qwen2 block under
    SDPA): two RMSNorm inputs and outputs, q/k/v and their rotated copies, the attention output
    and the o_proj input, and the gated MLP's gate, up, activation and product."""
    h, i = shape.hidden_size, shape.intermediate_size
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return dtype_bytes * (4 * h + 3 * q + 4 * kv + 4 * i)


def logits_bytes(rows: int, response_len: int, vocab_size: int, dtype_bytes: int) -> int:
    """The log-prob step's peak (``engines.logprob`` on ``engines.fsdp_forward``'s logits).

    The model returns the logits of the ``response_len + 1`` kept positions in the compute dtype
    (transformers' ``lm_head`` output is not upcast); the chunked log-prob keeps them for backward
    and a few numbers per token. Its backward writes their gradient (same dtype, same size) and
    the slice back to the kept positions is a second gradient of that size while the first is
    alive: two compute-dtype copies at the peak. The fp32 work is per chunk of about
    :data:`~rlctl.engines.logprob.CHUNK_ELEMENTS` logits: the upcast, the log-softmax, its exp and
    the gradient's product."""
    tokens = rows * (response_len + 1)
    chunk_tokens = min(tokens, max(1, LOGPROB_CHUNK_ELEMENTS // max(1, vocab_size)))
    return 2 * tokens * vocab_size * dtype_bytes + 4 * chunk_tokens * vocab_size * 4


@dataclass(frozen=True)
class Training:
    """One training role's bytes per device."""

    weights: int
    grads: int
    optimizer: int
    gathered: int
    activations: int  # micro-batch activations, as configured (checkpointing on or off)
    activations_no_checkpointing: int
    activations_checkpointing: int
    logits: int
    micro_batch_tokens: int
    checkpointing: bool

    @property
    def state(self) -> int:
        """What stays resident between steps (unless offloaded)."""
        return self.weights + self.grads + self.optimizer

    @property
    def peak(self) -> int:
        return self.state + self.gathered + self.activations + self.logits


def training_memory(
    shape: ModelShape,
    *,
    world: int,
    compute_dtype: str,
    batch_rows: int,
    micro_batch_sequences: int,
    micro_batch_tokens: int,
    seq_len: int,
    response_len: int,
    checkpointing: bool,
    group_size: int = 1,
    temperature: float = 1.0,
    value_head: bool = False,
    trainable: int | None = None,
) -> Training:  # ``temperature``: its scaled copy is per chunk only (in logits_bytes' chunk term)
    """Bytes per device of one FSDP2-trained model (actor or critic).

    Without checkpointing the actor computes each distinct prompt of a micro-batch once
    (``engines.prefix``: the ``group_size`` = ``rollout.n`` samples of a prompt are adjacent rows)
    and runs the responses against the prompt's cache repeated per row. ``trainable``: a LoRA
    actor's adapter parameters (fp32 master, gradients and AdamW state for those alone; the frozen
    base keeps only its weights)."""
    p = shape.params
    adapter = math.ceil((trainable if trainable is not None else p) / world)
    c = DTYPE_BYTES.get(compute_dtype, 4)
    sharded = math.ceil(p / world)
    gathered = 0
    if world > 1 or c != 4:  # FSDP all-gathers (and casts) one block, prefetching the next
        gathered = 2 * shape.layer_params * c
    if micro_batch_tokens > 0:
        rows = max(1, micro_batch_tokens // seq_len)
    else:
        rows = micro_batch_sequences
    rows = min(rows, batch_rows)  # a micro-batch never holds more than one mini-batch's rows
    tokens = rows * seq_len
    per_layer = activation_bytes_per_token_layer(shape, c)
    full = tokens * per_layer * shape.num_layers
    prompt_len = seq_len - response_len
    if not value_head and group_size > 1 and rows > 1:
        computed = -(-rows // group_size) * prompt_len + rows * response_len
        # the prompt's K and V, repeated per row and to every query head, that the response pass reads
        cache = rows * prompt_len * 2 * shape.num_heads * shape.head_dim * c
        full = computed * per_layer * shape.num_layers + cache * shape.num_layers
    # checkpointed: each layer keeps its input; one layer's activations are rebuilt in backward
    ckpt = tokens * shape.hidden_size * c * shape.num_layers + tokens * per_layer
    logits = 0 if value_head else logits_bytes(rows, response_len, shape.vocab_size, c)
    return Training(
        weights=4 * sharded + (4 * adapter if trainable is not None else 0),
        grads=4 * adapter,
        optimizer=8 * adapter,
        gathered=gathered,
        activations=ckpt if checkpointing else full,
        activations_no_checkpointing=full,
        activations_checkpointing=ckpt,
        logits=logits,
        micro_batch_tokens=tokens,
        checkpointing=checkpointing,
    )


@dataclass(frozen=True)
class Rollout:
    """The rollout engine's bytes per device."""

    engine: str
    weights: int
    kv_bytes_per_token: int
    max_model_len: int
    kv_per_max_len_sequence: int  # what vLLM checks against its KV budget at start-up
    kv_budget: int | None  # vLLM/SGLang: gmu x device - weights - activations; HF: None
    kv_step: int  # the KV cache of one step's sequences on this rank at the profile's lengths
    sequences_at_max_len: int | None
    reserved: int  # what the engine holds while awake (vLLM/SGLang: gmu x device)

    @property
    def peak(self) -> int:
        return self.reserved


def rollout_memory(
    shape: ModelShape,
    *,
    engine: str,
    dtype: str,
    tp: int,
    gpu_memory_utilization: float,
    device_bytes: int,
    max_model_len: int,
    rows_per_rank: int,
    seq_len: int,
) -> Rollout:
    """Bytes per device of one rollout engine replica (tensor-parallel shard ``tp``)."""
    b = DTYPE_BYTES.get(dtype, 4)
    weights = shape.params_per_rank(tp, engine) * b
    per_token = shape.kv_bytes_per_token(b, tp)
    # vLLM 0.33 FullAttentionSpec.max_memory_usage_bytes: cdiv(max_model_len, block_size) pages
    blocks = -(-max_model_len // VLLM_BLOCK_SIZE)
    per_max_seq = blocks * VLLM_BLOCK_SIZE * per_token
    kv_step = rows_per_rank * seq_len * per_token
    if engine in ("vllm", "sglang"):
        reserved = int(gpu_memory_utilization * device_bytes)
        activations = min(max_model_len, 8192) * activation_bytes_per_token_layer(shape, b)
        budget = reserved - weights - activations - ENGINE_RUNTIME_BYTES
        fit = max(0, budget) // per_max_seq if per_max_seq else None
        return Rollout(engine, weights, per_token, max_model_len, per_max_seq, budget, kv_step, fit, reserved)
    # HF transformers: the step's KV cache plus the last position's logits of every row
    logits = rows_per_rank * shape.vocab_size * 4 * 2
    return Rollout(
        engine,
        weights,
        per_token,
        max_model_len,
        per_max_seq,
        None,
        kv_step,
        None,
        weights + kv_step + logits,
    )


@dataclass(frozen=True)
class Sync:
    """Moving the actor's weights into the rollout layout after each update."""

    bytes: int
    link_gb_s: float | None
    seconds: float | None
    path: str


def sync_memory(
    shape: ModelShape,
    *,
    dtype: str,
    world: int,
    link_gb_s: float | None,
    hbm_gb_s: float | None,
    params: int | None = None,
    tp: int = 1,
    moved_per_rank: int | None = None,
) -> Sync:
    """Bytes each rollout rank receives and the time at the device's link: at TP 1 every rank
    gathers the (world-1)/world it does not hold over the link (one direction: half the
    datasheet's bidirectional figure), then copies into the engine at memory bandwidth. At TP > 1
    each rank takes only its 1/tp piece, ``moved_per_rank`` of it over the link (the planner's
    count, :func:`rlctl.reshard.train_to_rollout_plan`), the rest copied locally.
    ``params``: what is sent, when not the whole model (a LoRA adapter)."""
    b = DTYPE_BYTES.get(dtype, 4)
    total = (shape.params if params is None else params) * b
    if tp > 1 and moved_per_rank is not None:
        piece = -(-total // tp)
        seconds = (moved_per_rank / (link_gb_s / 2 * 1e9) if link_gb_s else 0.0) + (
            piece / (hbm_gb_s * 1e9) if hbm_gb_s else 0.0
        )
        return Sync(piece, link_gb_s, seconds or None, f"planned move into tensor-parallel {tp} pieces")
    if world == 1 or not link_gb_s:
        seconds = total / (hbm_gb_s * 1e9) if hbm_gb_s else None
        return Sync(total, link_gb_s, seconds, "in-device copy" if hbm_gb_s else "in-process copy")
    over_link = total * (world - 1) / world
    seconds = over_link / (link_gb_s / 2 * 1e9) + (total / (hbm_gb_s * 1e9) if hbm_gb_s else 0.0)
    return Sync(total, link_gb_s, seconds, f"all-gather over {world} ranks")


def to_gib(value: int | None) -> float | None:
    return None if value is None else round(value / GIB, 3)


def as_gib_dict(obj: Any) -> dict[str, Any]:
    """A section as JSON: byte counts in GiB (``*_gib``), other fields as they are."""
    out: dict[str, Any] = {}
    for k, v in asdict(obj).items():
        if k in BYTE_FIELDS and (v is None or (isinstance(v, int) and not isinstance(v, bool))):
            out[f"{k}_gib"] = to_gib(v)
        else:
            out[k] = v
    for prop in ("state", "peak"):
        if hasattr(type(obj), prop):
            out[f"{prop}_gib"] = to_gib(getattr(obj, prop))
    return out


BYTE_FIELDS = {
    "weights",
    "grads",
    "optimizer",
    "gathered",
    "activations",
    "activations_no_checkpointing",
    "activations_checkpointing",
    "logits",
    "kv_per_max_len_sequence",
    "kv_budget",
    "kv_step",
    "reserved",
    "bytes",
}
