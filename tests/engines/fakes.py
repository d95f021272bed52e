"""Fake ``vllm`` and ``sglang`` packages built from the recorded API surfaces of real releases.

``surfaces/<package>-<version>.json`` (written by ``ci/api_surface.py`` from the released wheels)
gives each version's method signatures and the field names of ``EngineArgs`` / ``ServerArgs`` /
``SamplingParams``. The fakes raise as the real library does: an unknown keyword to a dataclass is
``TypeError: EngineArgs.__init__() got an unexpected keyword argument 'x'``, to a msgspec struct
``TypeError: Unexpected keyword argument 'x'``; a method a version lacks is an ``AttributeError``;
a call that does not fit the recorded signature is the ``TypeError`` Python raises for it. The
version is published as real installs do: a ``<name>-<version>.dist-info`` on ``sys.path`` (read
with ``importlib.metadata``) and ``__version__``.

Generation is done by the real HF model (:class:`rlctl.engines.hf_rollout.HFRolloutEngine`), one
request at a time, so samples and log-probs can be checked numerically. Behaviour that depends on
the version is modelled from the source (paths inside the wheels):

- vLLM seeds: each request draws from its own ``SamplingParams.seed`` (0.10.2
  ``vllm/v1/worker/gpu_input_batch.py``: ``torch.Generator().manual_seed(seed)`` per request; 0.33
  ``vllm/v1/worker/gpu/sample/states.py``: noise from ``(seed, position)``): one seed shared by all
  requests gives identical samples for identical prompts. No seed: a fresh random one.
- vLLM log-probs (``vllm/v1/sample/sampler.py``): ``raw_logprobs`` = ``log_softmax(logits)``;
  ``processed_logprobs`` = before temperature on 0.10.0-0.10.1.1, after temperature and after
  top-k/top-p renormalisation from 0.10.2; an all-greedy batch returns ``log_softmax(logits)``.
- vLLM prompt log-probs (``SamplingParams.prompt_logprobs``): ``RequestOutput.prompt_logprobs`` is
  ``[None]`` then one ``{token: Logprob}`` per later prompt position holding the prompt token
  (``vllm/v1/engine/logprobs.py``, 0.10.2 and 0.33.0), ``log_softmax`` of the raw logits whatever
  the temperature and ``logprobs_mode`` (0.10.2 ``v1/sample/sampler.py`` ``compute_logprobs``;
  0.33.0 ``v1/worker/gpu/sample/prompt_logprob.py``).
- vLLM sleep (``vllm/device_allocator/cumem.py``): level 1 keeps the weights on the host, level 2
  discards them (they wake as garbage); ``wake_up`` without ``tags`` wakes everything.
- Tensor parallelism (vLLM ``tensor_parallel_size`` > 1 with the external launcher; SGLang
  ``tp_size`` > 1): per-rank shards held and loaded as the real loaders do, in
  ``tests/engines/fake_vllm_tp.py``.
- SGLang seeds (``sglang/srt/sampling/sampling_batch_info.py``): ``sampling_seed`` is used only
  with ``enable_deterministic_inference``, which gives unseeded requests seed 42; otherwise every
  draw is random.
- SGLang log-probs (``sglang/srt/layers/sampler.py``): ``log_softmax(logits / T)`` before
  top-k/top-p; greedy requests (temperature 0 -> 1, top_k 1, ``sampling/sampling_params.py``) and
  ``[SGLANG_]RETURN_ORIGINAL_LOGPROB`` give ``log_softmax(logits)``.
- SGLang input log-probs (``Engine.generate(return_logprob=True, logprob_start_len=s)``):
  ``meta_info["input_token_logprobs"]`` holds ``(logprob, token, None)`` for prompt tokens ``s:``,
  the first logprob None (0.5.3 ``managers/scheduler_output_processor_mixin.py``, 0.5.23
  ``scheduler_components/logprob_result_processor.py``); ``s = -1`` (the default) scores only the
  last prompt token (0.5.3 ``managers/scheduler.py``); ``log_softmax`` of the logits, at temperature
  1 here (``layers/logits_processor.py`` divides only with ``temp_scaled_logprobs``).
- SGLang weight-update session (0.5.21+,
  ``sglang/srt/managers/scheduler_components/weight_updater.py``): ``update_weights_from_tensor``
  outside ``begin_weight_update()`` / ``end_weight_update()`` returns ``(False, message)``.
- SGLang memory saver: released weights come back as garbage (zeros here) unless
  ``enable_weights_cpu_backup``; resuming what is not released raises ``KeyError``. The regions are
  the surface's ``memory_regions`` (``sglang/srt/constants.py``: ``GPU_MEMORY_ALL_TYPES`` = kv_cache,
  weights, cuda_graph in 0.5.23; 0.5.3 has kv_cache and weights); ``resident()`` is what a tagged
  release left in device memory (0.5.23 ``scheduler_components/weight_updater.py`` pauses only the
  tags it is given; no tags means all of them).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import os
import random
import sys
import types
from pathlib import Path
from typing import Any

import torch

from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.engines.sampling import filter_top_k_top_p
from tests.engines import fake_vllm_steps, fake_vllm_tp
from tests.engines.fake_vllm_lora import LoraHolder, SGLangLoras, lora_modules

SURFACES = Path(__file__).parent / "surfaces"
VLLM_VERSIONS = (
    "0.10.2",
    "0.13.0",
    "0.33.0",
)  # the floor rlctl pins, the first that validates a forced backend, the newest
SGLANG_VERSIONS = ("0.5.3", "0.5.23")
_EPS = 1e-5  # vLLM / SGLang _SAMPLING_EPS


def load_surface(package: str, version: str) -> dict:
    return json.loads((SURFACES / f"{package}-{version}.json").read_text())


def release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:3])


def install_dist(root: Path, name: str, version: str) -> None:
    """A ``name-version.dist-info`` under ``root`` (put ``root`` on sys.path): what pip leaves."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


# -- signatures and structs from the surface ---------------------------------------------------------
_KINDS = {
    "positional_only": inspect.Parameter.POSITIONAL_ONLY,
    "positional_or_keyword": inspect.Parameter.POSITIONAL_OR_KEYWORD,
    "var_positional": inspect.Parameter.VAR_POSITIONAL,
    "keyword_only": inspect.Parameter.KEYWORD_ONLY,
    "var_keyword": inspect.Parameter.VAR_KEYWORD,
}


def signature(spec: dict) -> inspect.Signature:
    """The recorded signature (``self`` first) as an ``inspect.Signature``."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for p in spec["params"]:
        default = None if p["default"] else inspect.Parameter.empty
        params.append(inspect.Parameter(p["name"], _KINDS[p["kind"]], default=default))
    return inspect.Signature(params)


def recorded_method(qualname: str, spec: dict, impl):
    """A method with the recorded signature: a call that does not fit raises like Python's own check."""
    sig = signature(spec)

    def method(self, *args, **kwargs):
        try:
            bound = sig.bind(self, *args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{qualname}() {exc}") from None
        given = dict(bound.arguments)
        given.pop("self")
        for p in sig.parameters.values():
            if p.kind is inspect.Parameter.VAR_KEYWORD:
                given.update(given.pop(p.name, {}))
        return impl(self, **given)

    method.__name__ = qualname.rsplit(".", 1)[-1]
    method.__qualname__ = qualname
    method.__signature__ = sig
    return method


def dataclass_type(name: str, fields: list[str], defaults: dict[str, Any]) -> type:
    """A real dataclass with the recorded fields: unknown keywords raise exactly as the library's."""
    return dataclasses.make_dataclass(
        name, [(f, Any, dataclasses.field(default=copy.deepcopy(defaults.get(f)))) for f in fields]
    )


def msgspec_type(name: str, fields: list[str], defaults: dict[str, Any]) -> type:
    """Stands in for a ``msgspec.Struct``: keyword-only, ``__struct_fields__``, msgspec's error text."""

    def __init__(self, **kwargs):
        for key in kwargs:
            if key not in fields:
                raise TypeError(f"Unexpected keyword argument '{key}'")
        for f in fields:
            setattr(self, f, copy.deepcopy(kwargs.get(f, defaults.get(f))))
        post = getattr(self, "__post_init__", None)
        if post is not None:
            post()

    return type(name, (), {"__init__": __init__, "__struct_fields__": tuple(fields)})


def init_type(name: str, fields: list[str], defaults: dict[str, Any]) -> type:
    """A plain class whose ``__init__`` takes exactly the recorded keywords (SGLang 0.5.3 SamplingParams)."""
    sig = signature(
        {"params": [{"name": f, "kind": "positional_or_keyword", "default": True} for f in fields]}
    )

    def __init__(self, *args, **kwargs):
        try:
            bound = sig.bind(self, *args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{name}.__init__() {exc}") from None
        for f in fields:
            setattr(self, f, copy.deepcopy(bound.arguments.get(f, defaults.get(f))))

    __init__.__signature__ = sig
    return type(name, (), {"__init__": __init__})


def struct_type(name: str, spec: dict, defaults: dict[str, Any], post_init=None) -> type:
    make = {"dataclass": dataclass_type, "msgspec": msgspec_type}.get(spec["kind"], init_type)
    cls = make(name, spec["fields"], defaults)
    if post_init is not None:
        cls.__post_init__ = post_init
        if spec["kind"] == "init":
            orig = cls.__init__

            def __init__(self, *a, **kw):
                orig(self, *a, **kw)
                post_init(self)

            __init__.__signature__ = orig.__signature__
            cls.__init__ = __init__
    return cls


# -- generation through the HF engine --------------------------------------------------------------------
def _hf_sample(hf: HFRolloutEngine, prompt, *, temperature, top_p, top_k, max_tokens, stop, seed, greedy):
    """One request: token ids up to and including the stop token, and the full logits per step."""
    assert prompt and all(isinstance(t, int) for t in prompt), "prompts must be plain unpadded token lists"
    ids = torch.tensor([prompt])
    kw = dict(
        temperature=1.0 if greedy else temperature,
        top_p=1.0 if greedy else top_p,
        top_k=0 if greedy else max(top_k, 0),
        max_new_tokens=max_tokens,
        greedy=greedy,
        eos_token_id=list(stop) or None,
    )
    if "seed" in inspect.signature(hf.generate).parameters:
        kw["seed"] = seed
    else:
        kw["generator"] = torch.Generator().manual_seed(seed)
    out = hf.generate(ids, torch.ones_like(ids), **kw)
    length = int(out["response_mask"].sum())
    tokens = out["responses"][0, :length].tolist()
    with torch.no_grad():
        logits = hf.model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    return tokens, logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]


def _prompt_scores(hf: HFRolloutEngine, prompt: list[int]) -> list[float]:
    """``log_softmax`` of the raw logits at each prompt position for the next prompt token."""
    with torch.no_grad():
        logits = hf.model(input_ids=torch.tensor([prompt])).logits[0, :-1].float()
    return _token_log_probs(logits, prompt[1:])


def _token_log_probs(scores: torch.Tensor, tokens: list[int]) -> list[float]:
    logp = torch.log_softmax(scores, dim=-1)
    return [float(logp[t, tok]) for t, tok in enumerate(tokens)]


def _random_seed() -> int:
    return random.SystemRandom().getrandbits(31)


def _zero_weights(hf: HFRolloutEngine) -> None:
    """Memory released without a host copy comes back with whatever the allocator hands out."""
    with torch.no_grad():
        for t in list(hf.model.parameters()) + list(hf.model.buffers()):
            t.zero_()


# -- vLLM --------------------------------------------------------------------------------------------------
def make_fake_vllm(
    calls: list,
    version: str = VLLM_VERSIONS[-1],
    surface: dict | None = None,
    *,
    rocm: bool = False,
    ascend: bool = False,
    **_,
) -> types.ModuleType:
    """A ``vllm`` module of ``version``; every call is appended to ``calls``. ``rocm``: the ROCm
    build, where FLASH_ATTN asserts in its first forward (``fa_utils.get_flash_attn_version``
    returns None on ROCm; ``FlashAttentionImpl.forward`` asserts, vllm 0.33.0). ``ascend``: the
    vllm-ascend 0.23.0.post1 worker, whose ``wake_up`` raises while the weight NZ mode is non-zero
    (see :func:`_ascend_nz_mode`)."""
    s = surface or load_surface("vllm", version)
    rel = release(version)
    vllm = types.ModuleType("vllm")
    vllm.__version__ = version
    vllm.submodules = lora_modules(s, rel, msgspec_type, recorded_method)  # vllm.lora.request, ...
    engine_mod = vllm.submodules.get("vllm.v1.engine.llm_engine")

    # async_scheduling: SchedulerConfig's default, False in 0.10.2/0.13.0, None in 0.33.0
    # (vllm/config/scheduler.py); 0.23.0 not read, taken as 0.33.0's
    engine_defaults = {"logprobs_mode": "raw_logprobs", "seed": 0, "async_scheduling": False if rel < (0, 23) else None}
    EngineArgs = struct_type("EngineArgs", s["EngineArgs"], engine_defaults)

    def _sp_post_init(self):  # vllm/sampling_params.py __post_init__ / _verify_args
        if self.top_k is not None and self.top_k < -1:
            raise ValueError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if self.temperature < _EPS:  # greedy: truncation off
            self.top_p, self.top_k = 1.0, 0

    SamplingParams = struct_type(
        "SamplingParams",
        s["SamplingParams"],
        {"n": 1, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_tokens": 16, "stop_token_ids": []},
        _sp_post_init,
    )

    class Logprob:
        def __init__(self, logprob: float, rank: int | None = None, decoded_token: str | None = None):
            self.logprob, self.rank, self.decoded_token = logprob, rank, decoded_token

    class CompletionOutput:
        def __init__(self, token_ids, logprobs):
            self.index, self.token_ids, self.logprobs, self.text = 0, token_ids, logprobs, ""

    class RequestOutput:
        def __init__(self, prompt_token_ids, outputs, prompt_logprobs=None):
            self.prompt_token_ids, self.outputs = prompt_token_ids, outputs
            self.prompt_logprobs = prompt_logprobs

    class Worker:
        def __init__(self, hf):
            # vLLM's model class is named after the HF architecture (vllm/model_executor/models/registry.py)
            arch = (getattr(hf.model.config, "architectures", None) or ["Qwen2ForCausalLM"])[0]
            self.model_runner = types.SimpleNamespace(model=type(arch, (_LoadWeights,), {})(hf))

    def __init__(self, **given):
        args = EngineArgs(**given)  # vllm/entrypoints/llm.py: every keyword ends in EngineArgs(...)
        mode = str(getattr(args.logprobs_mode, "value", args.logprobs_mode))
        if mode not in s["logprobs_modes"]:
            raise ValueError(f"logprobs_mode={mode!r} is not one of {s['logprobs_modes']}")
        attention = getattr(args, "attention_config", None)
        if isinstance(attention, dict):  # LLM._make_config keeps init fields only (0.33)
            attention = {k: v for k, v in attention.items() if k in s["AttentionConfig"]["fields"]}
            backend = attention.get("backend")
            if backend is not None and backend not in s["attention_backends"]["names"]:
                raise ValueError(f"Invalid attention backend {backend!r}")
            if rocm and backend == "FLASH_ATTN":  # LLM() runs a forward in its memory profiling
                raise AssertionError("FlashAttention version not detected.")
        calls.append(("LLM", given))
        self.engine_args, self.logprobs_mode = args, mode
        self.hf = HFRolloutEngine(given["model"])
        module, cls = args.worker_extension_cls.rsplit(".", 1)
        ext = getattr(__import__(module, fromlist=[cls]), cls)
        self.tp = int(getattr(args, "tensor_parallel_size", None) or 1)
        if self.tp > 1:  # one TP worker in this process (tests/engines/fake_vllm_tp.py)
            self.worker = fake_vllm_tp.tp_worker(args, ext, self.hf, self.tp)
        else:
            self.worker = type("WorkerWithExtension", (Worker, ext), {})(self.hf)
        self.lora = (engine_mod.LLMEngine if engine_mod else LoraHolder)(args, self.hf, calls)
        if engine_mod is not None:
            self.llm_engine = self.lora
            fake_vllm_steps.attach(
                self.llm_engine,
                self,
                rel,
                lambda logits, tokens, sp: _log_probs(self, logits, tokens, sp, sp.temperature < _EPS),
                Logprob,
                CompletionOutput,
                calls,
            )
        self.sleeping: set[str] = set()
        self.host_copy = None
        self.nz_mode = _ascend_nz_mode(args) if ascend else 0

    def _log_probs(self, logits, tokens, sp, all_greedy):
        if self.logprobs_mode == "raw_logits":
            return [float(logits[t, tok]) for t, tok in enumerate(tokens)]
        if self.logprobs_mode == "raw_logprobs" or all_greedy or rel < (0, 10, 2):
            return _token_log_probs(logits, tokens)  # before temperature
        scaled = filter_top_k_top_p(logits / sp.temperature, max(sp.top_k, 0), sp.top_p)
        return _token_log_probs(scaled, tokens)  # processed: after temperature and truncation

    def generate(self, prompts, sampling_params=None, lora_request=None, **_):
        if self.sleeping:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (engine asleep)")
        self.lora.use(lora_request)
        if self.tp > 1:  # sample from what the TP group's shards hold
            fake_vllm_tp.refresh_hf(self.worker, self.hf)
        if lora_request is not None:
            calls.append(("lora_request", lora_request.lora_int_id, lora_request.lora_name))
        params = (
            sampling_params if isinstance(sampling_params, list | tuple) else [sampling_params] * len(prompts)
        )
        assert len(params) == len(prompts), "vLLM: one SamplingParams for all prompts, or one per prompt"
        calls.append(("generate", [p["prompt_token_ids"] for p in prompts], [sp.__dict__ for sp in params]))
        all_greedy = all(sp.temperature < _EPS for sp in params)
        results = []
        for p, sp in zip(prompts, params, strict=True):
            assert sp.n == 1
            greedy = sp.temperature < _EPS
            tokens, logits = _hf_sample(
                self.hf,
                p["prompt_token_ids"],
                temperature=sp.temperature,
                top_p=sp.top_p,
                top_k=sp.top_k,
                max_tokens=sp.max_tokens,
                stop=[] if sp.ignore_eos and not sp.stop_token_ids else sp.stop_token_ids,
                seed=_random_seed() if sp.seed is None else sp.seed,
                greedy=greedy,
            )
            logprobs = None
            if sp.logprobs is not None:
                values = _log_probs(self, logits, tokens, sp, all_greedy)
                logprobs = [{t: Logprob(v, rank=1)} for t, v in zip(tokens, values, strict=True)]
            prompt_logprobs = None
            if getattr(sp, "prompt_logprobs", None) is not None:
                ids = p["prompt_token_ids"]
                values = _prompt_scores(self.hf, ids)
                prompt_logprobs = [None] + [{t: Logprob(v)} for t, v in zip(ids[1:], values, strict=True)]
            results.append(
                RequestOutput(p["prompt_token_ids"], [CompletionOutput(tokens, logprobs)], prompt_logprobs)
            )
        return results

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        calls.append(("collective_rpc", method, len(args[0]) if args else 0))
        if "weights" in self.sleeping:
            raise RuntimeError("CUDA error: weights are asleep")
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def reset_prefix_cache(self, reset_running_requests=False, **_):
        calls.append(("reset_prefix_cache",))
        if reset_running_requests:  # only where the recorded signature has it (0.13.0 on)
            self.llm_engine.preempt_running()
        return True

    def sleep(self, level=1, **_):
        calls.append(("sleep", level))
        if not self.engine_args.enable_sleep_mode:
            raise ValueError("Sleep mode is not enabled in the model config")
        self.host_copy = copy.deepcopy(self.hf.model.state_dict()) if level == 1 else None
        self.sleeping = {"weights", "kv_cache"}

    def wake_up(self, tags=None):
        calls.append(("wake_up", tags))
        if self.nz_mode:  # vllm_ascend/worker/worker.py NPUWorker.wake_up (0.23.0.post1)
            raise ValueError(
                "FRACTAL_NZ mode is enabled. This may cause model parameter precision issues "
                "in the RL scenarios. Please set weight_nz_mode=0 via --additional-config."
            )
        tags = set(tags) if tags is not None else {"weights", "kv_cache"}
        if "weights" in tags and "weights" in self.sleeping:
            if self.host_copy is None:
                _zero_weights(self.hf)  # level 2: discarded
                self.worker.model_runner.model.zero_()
            else:
                self.hf.model.load_state_dict(self.host_copy)
        self.sleeping -= tags

    impls = {
        "__init__": __init__,
        "generate": generate,
        "collective_rpc": collective_rpc,
        "reset_prefix_cache": reset_prefix_cache,
        "sleep": sleep,
        "wake_up": wake_up,
    }
    methods = {
        name: recorded_method(f"LLM.{name}", spec, impls[name]) for name, spec in s["LLM"]["methods"].items()
    }
    vllm.LLM = type("LLM", (), methods)
    vllm.EngineArgs, vllm.SamplingParams, vllm.Logprob = EngineArgs, SamplingParams, Logprob
    return vllm


def _ascend_nz_mode(args) -> int:
    """vllm-ascend 0.23.0.post1 ``AscendConfig.weight_nz_mode`` (``vllm_ascend/ascend_config.py``),
    read once when the engine is built: ``additional_config["weight_nz_mode"]`` when given, else
    ``VLLM_ASCEND_ENABLE_NZ`` (``vllm_ascend/envs.py``: ``int(os.getenv(..., 1))``, default 1)."""
    extra = getattr(args, "additional_config", None) or {}
    if "weight_nz_mode" in extra:
        return int(extra["weight_nz_mode"])
    return int(os.getenv("VLLM_ASCEND_ENABLE_NZ", 1))


class _LoadWeights:
    """Stands in for a vLLM model: ``load_weights(weights) -> set of loaded names``, and its
    parameters in vLLM's own layout, which is what ``model_runner.model.named_parameters()`` shows:
    q/k/v stacked into ``qkv_proj`` and gate/up into ``gate_up_proj`` along dim 0 (class attribute
    ``packed_modules_mapping``; the merged layer's ``output_sizes``, ``layers/linear.py``), vocab
    rows padded to a multiple of 64 (``vocab_parallel_embedding.py``: ``pad_vocab_size``). Sampling
    runs on the HF model; ``load_weights`` writes both, as vLLM's weight loaders write the slices.
    """

    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }
    VOCAB_PADDING = 64

    def __init__(self, hf: HFRolloutEngine):
        self.hf = hf
        self.params: dict[str, torch.Tensor] = {}
        self.where: dict[str, tuple[str, int]] = {}  # HF name -> (vLLM name, first row)
        self.output_sizes: dict[str, list[int]] = {}  # merged module path -> row counts
        stacked: dict[tuple[str, str], dict[str, tuple[str, torch.Tensor]]] = {}
        for name, p in hf.model.named_parameters():  # tied weights once, as vLLM holds them
            path, _, leaf = name.rpartition(".")
            prefix, _, sub = path.rpartition(".")
            fused = next((f for f, parts in self.packed_modules_mapping.items() if sub in parts), None)
            if fused is not None:
                stacked.setdefault((f"{prefix}.{fused}", leaf), {})[sub] = (name, p)
            elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
                rows = -(-p.shape[0] // self.VOCAB_PADDING) * self.VOCAB_PADDING
                padded = torch.zeros((rows, *p.shape[1:]), dtype=p.dtype, device=p.device)
                padded[: p.shape[0]] = p.detach()
                self.params[name], self.where[name] = padded, (name, 0)
            else:
                self.params[name], self.where[name] = p.detach().clone(), (name, 0)
        for (path, leaf), pieces in stacked.items():
            parts = self.packed_modules_mapping[path.rpartition(".")[2]]
            tensors, first = [], 0
            for sub in parts:
                hf_name, p = pieces[sub]
                self.where[hf_name] = (f"{path}.{leaf}", first)
                tensors.append(p.detach())
                first += p.shape[0]
            self.params[f"{path}.{leaf}"] = torch.cat(tensors)
            self.output_sizes[path] = [t.shape[0] for t in tensors]

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        yield from self.params.items()

    def get_submodule(self, target: str):
        if target not in self.output_sizes:
            raise AttributeError(f"{type(self).__name__} has no attribute `{target}`")
        return types.SimpleNamespace(output_sizes=list(self.output_sizes[target]))

    def load_weights(self, weights):
        weights = list(weights)
        self.hf.update_weights(weights)
        with torch.no_grad():
            for name, tensor in weights:
                target, first = self.where[name]
                dst = self.params[target]
                dst.narrow(0, first, tensor.shape[0]).copy_(tensor.to(device=dst.device, dtype=dst.dtype))
        return {name for name, _ in weights}

    def zero_(self) -> None:
        for t in self.params.values():
            t.zero_()


# -- SGLang ------------------------------------------------------------------------------------------------
def make_fake_sglang(
    calls: list,
    version: str = SGLANG_VERSIONS[-1],
    surface: dict | None = None,
    *,
    device_capability: tuple[int, int] = (9, 0),
    **_,
) -> dict:
    """``{module name: module}`` for ``sglang`` of ``version`` (put every one into sys.modules).
    ``attention_backend="fa3"`` asserts off SM 8.x/9.0 as ``create_flashattention_v3_backend`` does
    (sglang 0.5.23 ``layers/attention/attention_registry.py``) on ``device_capability``."""
    s = surface or load_surface("sglang", version)
    rel = release(version)
    sglang = types.ModuleType("sglang")
    sglang.__version__ = version
    server_args_mod = types.ModuleType("sglang.srt.server_args")
    constants_mod = types.ModuleType("sglang.srt.constants")
    regions = list(s["memory_regions"]["names"])
    for region in regions:
        setattr(constants_mod, f"GPU_MEMORY_TYPE_{region.upper()}", region)
    if "cuda_graph" in regions:  # the list exists from the release that added cuda_graph
        constants_mod.GPU_MEMORY_ALL_TYPES = regions
    sampling_mod = types.ModuleType("sglang.srt.sampling.sampling_params")
    ServerArgs = struct_type("ServerArgs", s["ServerArgs"], {"random_seed": None})

    def _sp_post_init(self):  # sglang/srt/sampling/sampling_params.py
        if 0 <= self.temperature < _EPS:  # greedy
            self.temperature, self.top_k = 1.0, 1

    SamplingParams = struct_type(
        "SamplingParams",
        s["SamplingParams"],
        {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 128, "ignore_eos": False},
        _sp_post_init,
    )
    env_original = "RETURN_ORIGINAL_LOGPROB" if rel < (0, 5, 10) else "SGLANG_RETURN_ORIGINAL_LOGPROB"
    has_session = "begin_weight_update" in s["Engine"]["methods"]

    def __init__(self, **kwargs):
        self.server_args = ServerArgs(**kwargs)  # sglang/srt/entrypoints/engine.py: ServerArgs(**kwargs)
        if kwargs.get("attention_backend") == "fa3" and device_capability[0] not in (8, 9):
            raise AssertionError(
                "FlashAttention v3 Backend requires SM>=80 and SM<=90. Please use `--attention-backend flashinfer`."
            )
        calls.append(("Engine", kwargs))
        self.hf = HFRolloutEngine(kwargs["model_path"])
        tp = int(getattr(self.server_args, "tp_size", None) or 1)
        self.schedulers = fake_vllm_tp.sglang_schedulers(self.hf, tp) if tp > 1 else None
        # sglang/srt/configs/model_config.py _derive_context_length (0.5.23; same in 0.5.3)
        derived = self.hf.model.config.max_position_embeddings
        wanted = kwargs.get("context_length")
        if wanted is not None and wanted > derived and not os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"):
            raise ValueError(
                f"Warning: User-specified context_length ({wanted}) is greater than the derived "
                f"context_length ({derived}). ... To allow overriding this maximum, set the env var "
                "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"
            )
        self.context_len = wanted if wanted is not None else derived
        self.loras = SGLangLoras(self.server_args, self.hf, calls)
        self.released: set[str] = set()
        self.host_copy = None
        self.session_open = False

    def generate(
        self,
        prompt=None,
        sampling_params=None,
        input_ids=None,
        return_logprob=False,
        logprob_start_len=None,
        lora_path=None,
        **_,
    ):
        if self.released:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (memory released)")
        self.loras.use_names(lora_path)
        if lora_path is not None:
            calls.append(("lora_path", list(lora_path)))
        dicts = (
            sampling_params if isinstance(sampling_params, list) else [sampling_params or {}] * len(input_ids)
        )
        params = [SamplingParams(**d) for d in dicts]  # tokenizer_manager: SamplingParams(**sampling_kwargs)
        calls.append(("generate", input_ids, [dict(d) for d in dicts], return_logprob))
        deterministic = bool(getattr(self.server_args, "enable_deterministic_inference", False))
        all_greedy = all(sp.top_k == 1 for sp in params)
        raw = os.environ.get(env_original, "").lower() in ("1", "true")
        out = []
        for ids, sp in zip(input_ids, params, strict=True):
            seed = getattr(sp, "sampling_seed", None)
            seed = (42 if seed is None else seed) if deterministic else _random_seed()
            tokens, logits = _hf_sample(
                self.hf,
                ids,
                temperature=sp.temperature,
                top_p=sp.top_p,
                top_k=sp.top_k,
                max_tokens=sp.max_new_tokens,
                stop=[] if sp.ignore_eos else sorted(sp.stop_token_ids or []),
                seed=seed,
                greedy=sp.top_k == 1,
            )
            meta = {"completion_tokens": len(tokens)}
            if return_logprob:
                scores = logits if (all_greedy or raw) else logits / sp.temperature
                values = _token_log_probs(scores, tokens)
                meta["output_token_logprobs"] = [(v, t, None) for t, v in zip(tokens, values, strict=True)]
                start = len(ids) - 1 if logprob_start_len in (None, -1) else logprob_start_len
                scored = [None, *_prompt_scores(self.hf, ids)][start:]
                meta["input_token_logprobs"] = [
                    (v, t, None) for v, t in zip(scored, ids[start:], strict=True)
                ]
            out.append({"text": "", "output_ids": tokens, "meta_info": meta})
        return out

    def begin_weight_update(self, selector="all"):
        calls.append(("begin_weight_update",))
        if self.session_open:
            return False, "a weight-update session is already open; call end_weight_update() first"
        self.session_open = True
        return True, "Success"

    def end_weight_update(self):
        calls.append(("end_weight_update",))
        if not self.session_open:
            return False, "no weight-update session is open; call begin_weight_update() first"
        self.session_open = False
        return True, "Success"

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        calls.append(("update_weights_from_tensor", len(named_tensors), flush_cache))
        if has_session and not self.session_open:
            return (
                False,
                "update_weights_from_tensor must run between begin_weight_update() and end_weight_update()",
            )
        if "weights" in self.released:
            raise RuntimeError("CUDA error: weights are released")
        if self.schedulers is not None:  # one scheduler per TP rank (tests/engines/fake_vllm_tp.py)
            fake_vllm_tp.sglang_load(self.schedulers, named_tensors, self.hf)
            return True, "Success"
        self.hf.update_weights(named_tensors)
        return True, "Success"

    def release_memory_occupation(self, tags=None):
        calls.append(("release_memory_occupation", tags))
        assert self.server_args.enable_memory_saver, "release_memory_occupation needs enable_memory_saver"
        tags = set(tags) if tags else set(regions)
        if "weights" in tags:
            backup = getattr(self.server_args, "enable_weights_cpu_backup", False)
            self.host_copy = copy.deepcopy(self.hf.model.state_dict()) if backup else None
        self.released |= tags

    def resume_memory_occupation(self, tags=None):
        calls.append(("resume_memory_occupation", tags))
        tags = set(tags) if tags else set(regions)
        for tag in tags:
            if tag not in self.released:
                raise KeyError(tag)  # torch_memory_saver: resuming what is not paused
        if "weights" in tags:
            if self.host_copy is None:
                _zero_weights(self.hf)
            else:
                self.hf.model.load_state_dict(self.host_copy)
        self.released -= tags

    def flush_cache(self):
        return True

    def resident(self):
        """Memory regions still held on the device."""
        return set(regions) - self.released

    def shutdown(self):
        pass

    impls = {
        "__init__": __init__,
        "generate": generate,
        "begin_weight_update": begin_weight_update,
        "end_weight_update": end_weight_update,
        "update_weights_from_tensor": update_weights_from_tensor,
        "release_memory_occupation": release_memory_occupation,
        "resume_memory_occupation": resume_memory_occupation,
        "flush_cache": flush_cache,
        "shutdown": shutdown,
        "load_lora_adapter": lambda self, **kw: self.loras.load(**kw),
        "unload_lora_adapter": lambda self, **kw: self.loras.unload(**kw),
    }
    extra = {"resident": resident}
    methods = {
        name: recorded_method(f"Engine.{name}", spec, impls[name])
        for name, spec in s["Engine"]["methods"].items()
    }
    sglang.Engine = type("Engine", (), {**methods, **extra})
    server_args_mod.ServerArgs = ServerArgs
    sampling_mod.SamplingParams = SamplingParams
    srt = types.ModuleType("sglang.srt")
    sampling_pkg = types.ModuleType("sglang.srt.sampling")
    sglang.srt, srt.server_args, srt.sampling, sampling_pkg.sampling_params = (
        srt,
        server_args_mod,
        sampling_pkg,
        sampling_mod,
    )
    return {
        **fake_vllm_tp.sglang_modules(version),
        "sglang": sglang,
        "sglang.srt": srt,
        "sglang.srt.server_args": server_args_mod,
        "sglang.srt.constants": constants_mod,
        "sglang.srt.sampling": sampling_pkg,
        "sglang.srt.sampling.sampling_params": sampling_mod,
    }


def install(
    monkeypatch,
    tmp_path: Path,
    package: str,
    version: str,
    calls: list,
    surface: dict | None = None,
    **hardware,
):
    """Put the fake ``package==version`` into ``sys.modules`` with its dist metadata on ``sys.path``;
    ``hardware`` (``rocm=True``, ``device_capability=(10, 0)``) switches on the kernel asserts."""
    root = tmp_path / f"site-{package}-{version}"
    install_dist(root, package, version)
    monkeypatch.syspath_prepend(str(root))
    if package == "vllm":
        vllm = make_fake_vllm(calls, version, surface, **hardware)
        monkeypatch.setitem(sys.modules, "vllm", vllm)
        for name in ("vllm.lora", "vllm.lora.request", "vllm.v1", "vllm.v1.engine", "vllm.v1.engine.llm_engine"):
            if name in vllm.submodules:
                monkeypatch.setitem(sys.modules, name, vllm.submodules[name])
            else:  # a version without it: the import fails as it would
                monkeypatch.setitem(sys.modules, name, None)
    else:
        for name, module in make_fake_sglang(calls, version, surface, **hardware).items():
            monkeypatch.setitem(sys.modules, name, module)
