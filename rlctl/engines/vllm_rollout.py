"""vLLM rollout adapter (colocated offline ``vllm.LLM``), also vllm-ascend on Ascend NPUs.

Written against the released vLLM source (paths inside the wheel, versions 0.10.2 and 0.33.0; the
recorded surfaces are ``tests/engines/surfaces/vllm-*.json``). Not yet run on NVIDIA hardware;
unit-tested against fakes built from those surfaces. vllm-ascend is a vLLM platform plugin with
the same ``LLM`` API, so the same adapter serves ``device="npu"``.

- ``LLM(model, **kw)`` hands every extra keyword to ``EngineArgs`` (a dataclass: an unknown one is
  a ``TypeError``, ``vllm/engine/arg_utils.py``), so rlctl's own keywords are passed only where
  the installed ``EngineArgs`` has them, and the run's engine keywords (the platform's
  ``engine_settings("vllm")`` under ``rollout.engine_kwargs``) must all be fields of it, else a
  UserError names the key and the version. No attention backend is forced: vLLM picks its own
  (forcing FLASH_ATTN asserts on ROCm and fails MLA models from 0.13, see ``rlctl.platforms.kernels``).
- ``VLLM_ENABLE_V1_MULTIPROCESSING`` (default 1, ``vllm/envs.py`` 0.33.0) puts the engine core in a
  child process, where ``collective_rpc`` serialises every tensor through host memory
  (``vllm/v1/serial_utils.py`` ``_encode_tensor`` -> ``tensor_data``: ``.cpu()`` of each weight);
  the adapter runs vLLM in-process (``0``) and overrides a ``1`` found in the environment, saying so.
- One ``SamplingParams`` per request, each with its own ``seed``: vLLM seeds every request's
  generator with its ``seed`` (0.10.2 ``v1/worker/gpu_input_batch.py``; 0.33 V2 runner noise from
  ``(seed, position)``, ``v1/worker/gpu/sample/states.py``), so one shared seed would make a
  GRPO group's copies identical.
- Log-probs (``vllm/v1/sample/sampler.py``): ``raw_logprobs`` (the default) are
  ``log_softmax(logits)`` before temperature; ``logprobs_mode="processed_logprobs"`` from 0.10.2
  is after temperature and after top-k/top-p renormalisation (0.10.0-0.10.1.1 computed it before
  temperature); an all-greedy batch returns ``log_softmax(logits)``. The adapter asks for
  ``processed_logprobs`` and returns ``rollout_log_probs`` only when they equal rlctl's
  ``log_softmax(logits / T)`` untruncated (see :meth:`VLLMRolloutEngine.log_prob_gap`).
- ``sleep(level=1)`` offloads the weights to CPU and drops the KV cache; ``wake_up(tags=...)``
  (tags from 0.8.3) restores them. Weights are loaded in place through ``collective_rpc`` into
  :class:`RlctlWorkerExtension` (``worker_extension_cls``), which calls the model's
  ``load_weights`` with HF names; tensors pass by reference with the in-process executor
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).
- A LoRA actor: built with ``lora``, the engine enables vLLM's LoRA and each sync registers the
  adapter alone as a new ``LoRARequest`` that generate() then uses (:mod:`.vllm_lora`); the base
  is the checkpoint vLLM loaded at start (frozen, never resent). A vLLM without that API gets
  merged weights (``adapter_sync`` false, said by ``rlctl doctor``).
- In-flight weight swaps (``generate(swap=...)``): rlctl runs vLLM's step loop itself and loads
  weights between steps (:mod:`.vllm_inflight`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Sequence

import torch

from rlctl.engines.adapter_dir import split_adapter_stream
from rlctl.engines.engine_fields import check_engine_kwargs
from rlctl.engines.external_version import (
    accepts,
    field_default,
    init_fields,
    installed_version,
    only_known,
    release,
)
from rlctl.engines.inflight import KV_ON_SWAP, Swap
from rlctl.engines.lora import LoraSpec, is_adapter
from rlctl.engines.registry import register_engine
from rlctl.engines.rollout_batch import (
    assemble_rollout,
    bucketed,
    padded_versions,
    row_seeds,
    stop_token_ids,
    unpadded_prompts,
)
from rlctl.engines.vllm_inflight import generate_stepped, swap_gap
from rlctl.engines.vllm_lora import (
    AdapterPublisher,
    AdapterSyncFlag,
    adapter_api_gap,
    installed_adapter_gap,
    max_lora_rank,
)
from rlctl.engines.vllm_tp import VLLMTensorParallel, launcher_kwargs
from rlctl.engines.vllm_worker import RlctlWorkerExtension, vllm_view  # noqa: F401 (EXTENSION's path)
from rlctl.errors import RunError, UserError
from rlctl.log import get_logger

EXTENSION = "rlctl.engines.vllm_rollout.RlctlWorkerExtension"
MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
PROCESSED_AFTER_TEMPERATURE = (0, 10, 2)  # vllm/v1/sample/sampler.py: processed = after temperature


def in_process() -> None:
    """Run vLLM's engine core in this process: ``collective_rpc`` then passes tensors by reference."""
    found = os.environ.get(MULTIPROCESSING_ENV)
    if found not in (None, "0"):
        get_logger("rlctl.engines").warning(
            f"{MULTIPROCESSING_ENV}={found} in the environment would copy every synced weight through "
            "host memory (vllm/v1/serial_utils.py); the rollout engine runs in-process (0) instead",
        )
    os.environ[MULTIPROCESSING_ENV] = "0"


def install_hint(device: str) -> str:
    """How to install vLLM for this worker's device: the PyPI wheel is a CUDA build only."""
    if device == "npu":
        return "pip install vllm, then the matching vllm-ascend (its compatibility matrix)"
    if getattr(torch.version, "hip", None):
        return "a ROCm build of vLLM (the rocm/vllm container, or vLLM built from source for ROCm)"
    return "pip install 'rlctl[vllm]'"


def _import_vllm(device: str = "cuda"):
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise UserError(f"rollout backend 'vllm' needs the vllm package ({install_hint(device)})") from exc


@register_engine("rollout", model_type="*", backend="vllm", device="npu", vendor="ascend")
@register_engine("rollout", model_type="*", backend="vllm", device="cuda", vendor="rocm")
@register_engine("rollout", model_type="*", backend="vllm", device="cuda", vendor="nvidia")
class VLLMRolloutEngine(VLLMTensorParallel):
    """Same surface as :class:`~rlctl.engines.hf_rollout.HFRolloutEngine`, backed by ``vllm.LLM``."""

    adapter_sync = AdapterSyncFlag()
    adapter_sync_gap = staticmethod(installed_adapter_gap)

    def __init__(
        self,
        model_path: str,
        *,
        device: str = "cuda",
        dtype: str = "bfloat16",
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.5,
        seed: int = 0,
        bucket_bytes: int = 256 << 20,
        lora: LoraSpec | None = None,
        rank_order: str = "contiguous",
        **llm_kwargs,
    ):
        """``llm_kwargs``: the run's engine keywords (platform settings + ``rollout.engine_kwargs``),
        each a field of the installed ``EngineArgs``. ``lora``: vLLM's LoRA on, adapter-only syncs.
        ``tensor_parallel_size`` > 1: this rank is one TP worker of its replica (:mod:`.vllm_tp`)."""
        if tensor_parallel_size > 1 and lora is not None:
            raise UserError("rollout.tensor_parallel > 1 with actor.lora: the adapter sync sends whole tensors")
        vllm = _import_vllm(device)
        self._vllm = vllm
        self.version = installed_version("vllm")
        self.bucket_bytes = bucket_bytes
        in_process()
        fields = init_fields(vllm.EngineArgs)
        check_engine_kwargs(
            "vllm", llm_kwargs, version=str(self.version), fields=fields, where="rollout.engine_kwargs"
        )
        wanted: dict[str, object] = dict(
            dtype=dtype,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=True,
            worker_extension_cls=EXTENSION,
            seed=seed,
            trust_remote_code=trust_remote_code,
            skip_tokenizer_init=True,
            logprobs_mode="processed_logprobs",
        )
        if lora is not None:
            gap = adapter_api_gap(vllm, fields)
            if gap is not None:
                raise UserError(f"vllm {self.version} cannot hold a LoRA adapter ({gap}); use merged sync")
            wanted.update(
                enable_lora=True, max_lora_rank=max_lora_rank(lora.rank, release(self.version)), max_loras=1
            )
        kwargs = only_known(wanted, fields)
        for required in ("enable_sleep_mode", "worker_extension_cls"):
            if required not in kwargs:
                raise UserError(f"vllm {self.version} has no EngineArgs.{required}; install vllm>=0.10.2")
        kwargs.update(llm_kwargs)
        self.tp = tensor_parallel_size
        kwargs.update(launcher_kwargs(self.tp, rank_order, fields, str(self.version)))
        self.logprobs_mode = str(kwargs.get("logprobs_mode", "raw_logprobs"))
        # EngineArgs.async_scheduling: False by default in 0.13.0, None (on where supported) in 0.33.0
        self._async_scheduling = kwargs.get("async_scheduling", field_default(vllm.EngineArgs, "async_scheduling"))
        self._stream_interval = kwargs.get("stream_interval", 1)  # SchedulerConfig default (0.13.0, 0.33.0)
        self.llm = vllm.LLM(model=str(model_path), **kwargs)
        self.lora = lora
        self.adapter = None if lora is None else AdapterPublisher(self.llm, lora, str(model_path))
        self._sampling_fields = init_fields(vllm.SamplingParams)
        self._wake_tags = accepts(self.llm.wake_up, "tags")
        self.asleep_tags: set[str] = set()
        if self.tp > 1:
            self._tp_setup()

    # -- log-prob convention ---------------------------------------------------------------------
    def log_prob_gap(
        self, *, temperature: float, top_p: float, top_k: int, greedy: bool = False
    ) -> str | None:
        """None when generate() returns ``log_softmax(logits / T)`` untruncated; else why not."""
        truncated = (top_k is not None and top_k > 0) or top_p < 1.0
        processed = self.logprobs_mode == "processed_logprobs" and (
            release(self.version) >= PROCESSED_AFTER_TEMPERATURE
        )
        if processed and not greedy:  # after temperature and after top-k/top-p renormalisation
            if truncated:
                return (
                    f"vllm {self.version} log-probs are renormalised over the top-k/top-p set "
                    f"(top_k={top_k}, top_p={top_p})"
                )
            return None
        # raw mode, greedy batches and vLLM < 0.10.2: log_softmax(logits) without temperature
        if temperature != 1.0:
            what = "greedy" if greedy else self.logprobs_mode
            return f"vllm {self.version} {what} log-probs are before temperature (temperature={temperature})"
        return None

    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        max_new_tokens: int,
        greedy: bool = False,
        eos_token_id: int | Sequence[int] | None = None,
        pad_token_id: int = 0,
        seed: int | None = None,
        version: int | None = None,
        swap: Swap | None = None,
        kv_on_swap: str = "recompute",
    ) -> dict[str, torch.Tensor]:
        """Sample through vLLM; same keys as the HF engine (``rollout_log_probs`` only when exact).

        In-flight weight updates (:mod:`rlctl.engines.inflight`, :mod:`.vllm_inflight`): with
        ``version``, ``token_versions`` gives each response token's weight version; ``swap()`` is asked
        between vLLM's engine steps and its weights load in place while the requests keep running."""
        if self.asleep_tags:
            raise RunError("vLLM rollout engine is asleep; call wake() before generate()")
        if kv_on_swap not in KV_ON_SWAP:  # checked with or without a swap, as the HF engine does
            raise UserError(f"kv_on_swap must be one of {KV_ON_SWAP}, got {kv_on_swap!r}")
        if swap is not None:
            gap = swap_gap(
                self.llm,
                str(self.version),
                kv_on_swap,
                async_scheduling=self._async_scheduling,
                stream_interval=self._stream_interval,
                tp=self.tp,
            )
            if gap is not None:
                raise UserError(gap)
        stop = stop_token_ids(eos_token_id)
        exact = self.log_prob_gap(temperature=temperature, top_p=top_p, top_k=top_k, greedy=greedy) is None
        prompts = unpadded_prompts(prompt_ids, prompt_mask, n)
        params = []
        for row_seed in row_seeds(seed, len(prompts)):
            wanted = dict(
                n=1,
                temperature=0.0 if greedy else temperature,
                top_p=1.0 if greedy else top_p,
                top_k=top_k if top_k > 0 and not greedy else 0,  # 0: off on every version
                max_tokens=max_new_tokens,
                logprobs=0 if exact else None,  # 0: the sampled token's log-prob only
                stop_token_ids=stop,
                ignore_eos=not stop,
                seed=row_seed,
                detokenize=False,
            )
            params.append(self._vllm.SamplingParams(**only_known(wanted, self._sampling_fields)))
        current = 0 if version is None else int(version)
        if swap is not None:
            responses, reported, versions = generate_stepped(
                self.llm,
                prompts,
                params,
                version=current,
                swap=swap,
                kv_on_swap=kv_on_swap,
                load=self.update_weights,
                lora_kwargs=self._lora_kwargs(),
            )
        else:
            outputs = self.llm.generate(
                [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False, **self._lora_kwargs()
            )
            responses = [list(o.outputs[0].token_ids) for o in outputs]
            reported = [o.outputs[0].logprobs for o in outputs]
            versions = [[current] * len(tokens) for tokens in responses]
        log_probs = []
        if exact:
            for steps, tokens in zip(reported, responses, strict=True):
                log_probs.append([step[tok].logprob for step, tok in zip(steps, tokens, strict=True)])
        out = assemble_rollout(
            prompt_ids,
            prompt_mask,
            responses,
            log_probs if exact else None,
            n=n,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad_token_id,
        )
        if version is not None:
            out["token_versions"] = padded_versions(versions, max_new_tokens)
        return out

    def prompt_log_probs(self, token_ids: Sequence[int]) -> torch.Tensor | None:
        """Log-prob of each token after the first given the ones before it, scored by vLLM itself
        (the weight-sync canary's rollout side); None where this vLLM has no ``prompt_logprobs``.

        ``SamplingParams(prompt_logprobs=0)`` returns, per prompt position, a dict holding the
        prompt token's own ``Logprob`` (``RequestOutput.prompt_logprobs``, first entry None:
        ``vllm/v1/engine/logprobs.py``, 0.10.2 and 0.33.0). They are ``log_softmax`` of the raw
        logits whatever ``logprobs_mode`` and temperature say (0.10.2 ``v1/sample/sampler.py``
        ``compute_logprobs``; 0.33.0 ``v1/worker/gpu/sample/prompt_logprob.py`` converts logits
        only in the ``*_logits`` modes): rlctl's convention at temperature 1. A request asking for
        prompt log-probs skips the prefix cache (0.10.2 ``v1/core/kv_cache_manager.py``, 0.33.0
        ``sampling_params.py`` ``skip_reading_prefix_cache``), so the whole sequence is recomputed
        with the weights vLLM computes with. One extra token is decoded (``max_tokens`` >= 1).
        """
        if self.asleep_tags:
            raise RunError("vLLM rollout engine is asleep; call wake() before prompt_log_probs()")
        if "prompt_logprobs" not in self._sampling_fields:
            return None
        tokens = [int(t) for t in token_ids]
        wanted = dict(n=1, temperature=1.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
        params = self._vllm.SamplingParams(**only_known(wanted, self._sampling_fields))
        (request,) = self.llm.generate(
            [{"prompt_token_ids": tokens}], [params], use_tqdm=False, **self._lora_kwargs()
        )
        positions = list(request.prompt_logprobs or [])
        if len(positions) != len(tokens):
            raise RunError(f"vLLM returned {len(positions)} prompt log-probs for {len(tokens)} tokens")
        return torch.tensor([positions[i][tok].logprob for i, tok in enumerate(tokens) if i > 0])

    def _lora_kwargs(self) -> dict:
        """``lora_request=`` the newest synced adapter (none before the first sync: B is zero)."""
        request = None if self.adapter is None else self.adapter.request
        return {} if request is None else {"lora_request": request}

    # -- weights and memory ----------------------------------------------------------------------
    def _wake(self, tags: list[str]) -> None:
        if self._wake_tags:
            self.llm.wake_up(tags=tags)
            self.asleep_tags -= set(tags)
        else:  # no tags before vLLM 0.8.3: everything wakes at once
            self.llm.wake_up()
            self.asleep_tags = set()

    def update_weights(self, stream: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load HF-named tensors in buckets through ``collective_rpc``; drops the prefix cache.
        Built with ``lora``: the stream is the actor's adapter (``export_adapter``); its LoRA tensors
        become a new ``LoRARequest``, its ``modules_to_save`` copies load into the base in place."""
        if "weights" in self.asleep_tags:
            self._wake(["weights"])
        if self.tp > 1:  # planned shards, already in the worker's parameters (:mod:`.vllm_tp`)
            return self.update_shards(stream)
        count = 0
        if self.adapter is not None:
            lora_tensors, stream = split_adapter_stream(stream)
            if lora_tensors:
                self.adapter.publish(lora_tensors)
                count += len(lora_tensors)
        for bucket in bucketed(stream, self.bucket_bytes):
            results = self.llm.collective_rpc("rlctl_load_weights", args=(bucket,))
            if not results or any(int(r) != len(bucket) for r in results):
                raise RunError(f"vLLM workers loaded {results} of {len(bucket)} tensors")
            count += len(bucket)
        self.llm.reset_prefix_cache()
        return count

    def weight_fingerprint(
        self, spec: Sequence[tuple[str, tuple[int, ...]]], salt: int = 0
    ) -> dict[str, tuple[float, float, str] | None]:
        """Fingerprints of the HF-named tensors in ``spec`` at ``salt``'s positions, computed inside the vLLM worker over
        ``model_runner.model.named_parameters()`` (:meth:`RlctlWorkerExtension.rlctl_weight_fingerprint`).
        Built with ``lora``: trainer names map to the base's, the adapter tensors (held in vLLM's
        private LoRA manager) and the replaced originals of ``modules_to_save`` are None."""
        if self.tp > 1:  # each rank its shards, summed over the TP group (a collective)
            return self.tp_fingerprint(spec, salt)
        asked = [
            (name, tuple(shape))
            for name, shape in spec
            if self.lora is None or (not is_adapter(name) and ".original_module." not in name)
        ]
        results = self.llm.collective_rpc("rlctl_weight_fingerprint", args=(asked, salt))
        if not results:
            raise RunError("vLLM collective_rpc('rlctl_weight_fingerprint') returned no result")
        return {name: results[0].get(name) for name, _ in spec}

    def sleep(self) -> None:
        """Level 1: the weights go to CPU (restored by wake), the KV cache is dropped."""
        self.llm.sleep(level=1)
        self.asleep_tags = {"weights", "kv_cache"}

    def wake(self) -> None:
        """Restore what is still asleep: the weights (unless an update woke them) and the KV cache."""
        if self.asleep_tags:
            self._wake(sorted(self.asleep_tags))
        self.asleep_tags = set()
