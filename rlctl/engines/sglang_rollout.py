"""SGLang rollout adapter (offline ``sglang.Engine``).

Written against the released SGLang source (paths inside the wheel, versions 0.5.3 and 0.5.23; the
recorded surfaces are ``tests/engines/surfaces/sglang-*.json``). Not yet run on NVIDIA hardware;
unit-tested against fakes built from those surfaces.

- ``Engine(**kw)`` builds ``ServerArgs(**kw)`` (a dataclass through 0.5.19, a msgspec struct
  assembled from ``sglang/srt/arg_groups/fields/`` from 0.5.20): an unknown keyword raises, so
  rlctl's own keywords are passed only where the installed ``ServerArgs`` has them, and the run's
  engine keywords (platform ``engine_settings("sglang")`` under ``rollout.engine_kwargs``) must all
  be fields of it, else a UserError names the key and the version. ``fa3`` is never forced: it
  asserts SM 8.x/9.0 (``layers/attention/attention_registry.py``), so Blackwell would die at start.
- Sampling: one dict per request with its own ``sampling_seed`` (``sampling/sampling_params.py``,
  from 0.5.3). SGLang honours the seed only with ``enable_deterministic_inference`` (it then
  gives every unseeded request seed 42, ``sampling/sampling_batch_info.py``); without it the
  copies of a prompt still differ but a rerun does not repeat them.
- Log-probs (``layers/sampler.py``): ``log_softmax(logits / T)`` before top-k/top-p, rlctl's
  convention; an all-greedy batch (and ``SGLANG_RETURN_ORIGINAL_LOGPROB`` /
  ``RETURN_ORIGINAL_LOGPROB``) gives ``log_softmax(logits)``. "Greedy" is ``top_k <= 1``
  (``sampling/sampling_batch_info.py`` ``is_all_greedy``, 0.5.3 and 0.5.23), so ``top_k = 1`` at
  any temperature also returns log-probs without temperature.
- Weights: ``update_weights_from_tensor`` returns ``(success, message)`` and never raises; from
  0.5.21 it must run between ``begin_weight_update()`` and ``end_weight_update()``
  (``managers/scheduler_components/weight_updater.py``), else it returns ``success=False``. Every
  result is checked.
- Memory: ``release_memory_occupation(tags)`` frees without a host copy unless
  ``enable_weights_cpu_backup`` (from 0.5.3); the adapter enables it and releases the weights only
  when it is there, else it releases just the KV cache (released weights come back as garbage).
  The regions are ``sglang.srt.constants.GPU_MEMORY_ALL_TYPES``: ``kv_cache`` and ``weights`` in
  0.5.3, plus ``cuda_graph`` in 0.5.23 (``scheduler_components/weight_updater.py`` pauses it only
  when asked), so the adapter releases every region the installed version has.
- A LoRA actor: built with ``lora``, the engine enables SGLang's LoRA and each sync loads the
  adapter alone under a new name that generate() then passes (:mod:`.sglang_lora`); the base is
  the checkpoint SGLang loaded at start. An SGLang without that API gets merged weights.
- In-flight weight swaps (``generate(swap=...)``): generation in calls of ``swap_every`` tokens,
  swaps between calls (:mod:`.sglang_inflight`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Sequence

import torch

from rlctl.engines.adapter_dir import split_adapter_stream
from rlctl.engines.engine_fields import check_engine_kwargs
from rlctl.engines.external_version import accepts, init_fields, installed_version, only_known
from rlctl.engines.inflight import KV_ON_SWAP, Swap
from rlctl.engines.lora import LoraSpec
from rlctl.engines.registry import register_engine
from rlctl.engines.rollout_batch import (
    assemble_rollout,
    bucketed,
    padded_versions,
    row_seeds,
    stop_token_ids,
    unpadded_prompts,
)
from rlctl.engines.sglang_inflight import generate_chunked, keep_refusal
from rlctl.engines.sglang_lora import (
    AdapterPublisher,
    AdapterSyncFlag,
    installed_adapter_gap,
    server_lora_args,
)
from rlctl.engines.sglang_tp import SGLangTensorParallel, from_leader
from rlctl.errors import RunError, UserError

FREED_WITHOUT_BACKUP = ("kv_cache", "cuda_graph")  # regions that hold no state worth keeping
ORIGINAL_LOGPROB_ENV = ("SGLANG_RETURN_ORIGINAL_LOGPROB", "RETURN_ORIGINAL_LOGPROB")


def _import_sglang():
    try:
        return importlib.import_module("sglang")
    except ImportError as exc:
        # the PyPI wheel is a CUDA 13 build (sglang 0.5.23 METADATA: cuda-python>=13.0)
        how = (
            "a ROCm build of SGLang (the ROCm SGLang container, or SGLang built from source)"
            if getattr(torch.version, "hip", None)
            else "pip install 'rlctl[sglang]'"
        )
        raise UserError(f"rollout backend 'sglang' needs the sglang package ({how})") from exc


def memory_regions() -> tuple[str, ...]:
    """The memory regions the installed SGLang can release (``sglang/srt/constants.py``)."""
    try:
        constants = importlib.import_module("sglang.srt.constants")
    except ImportError:
        return ("kv_cache", "weights")
    listed = getattr(constants, "GPU_MEMORY_ALL_TYPES", None)  # 0.5.23; 0.5.3 has the constants only
    if listed is None:
        listed = [v for k, v in sorted(vars(constants).items()) if k.startswith("GPU_MEMORY_TYPE_")]
    return tuple(listed)


def _checked(result, what: str) -> None:
    """SGLang reports failure as ``(False, message)``; turn that into a RunError."""
    if isinstance(result, tuple | list) and result:
        success, message = result[0], result[1] if len(result) > 1 else ""
    else:
        success, message = getattr(result, "success", None), getattr(result, "message", "")
    if success is not True:
        raise RunError(f"SGLang {what} failed: {message or repr(result)}")


@register_engine("rollout", model_type="*", backend="sglang", device="cuda", vendor="rocm")
@register_engine("rollout", model_type="*", backend="sglang", device="cuda", vendor="nvidia")
class SGLangRolloutEngine(SGLangTensorParallel):
    """Same surface as :class:`~rlctl.engines.hf_rollout.HFRolloutEngine`, backed by ``sglang.Engine``."""

    adapter_sync = AdapterSyncFlag()
    adapter_sync_gap = staticmethod(installed_adapter_gap)
    swap_every = 16  # tokens per Engine.generate call while in-flight swaps are asked (:mod:`.sglang_inflight`)

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
        **engine_kwargs,
    ):
        """``engine_kwargs``: the run's engine keywords (platform settings + ``rollout.engine_kwargs``),
        each a field of the installed ``ServerArgs``. ``tensor_parallel_size`` > 1: one engine per
        replica, on its first rank (:mod:`.sglang_tp`)."""
        if tensor_parallel_size > 1 and lora is not None:
            raise UserError("rollout.tensor_parallel > 1 with actor.lora: the adapter sync sends whole tensors")
        sglang = _import_sglang()
        self.version = installed_version("sglang")
        self.bucket_bytes = bucket_bytes
        server_args = importlib.import_module("sglang.srt.server_args").ServerArgs
        fields = init_fields(server_args)
        check_engine_kwargs(
            "sglang", engine_kwargs, version=str(self.version), fields=fields, where="rollout.engine_kwargs"
        )
        wanted: dict[str, object] = dict(
            model_path=str(model_path),
            dtype=dtype,
            tp_size=tensor_parallel_size,
            mem_fraction_static=gpu_memory_utilization,
            enable_memory_saver=True,
            enable_weights_cpu_backup=True,
            random_seed=seed,
            trust_remote_code=trust_remote_code,
            skip_tokenizer_init=True,
        )
        if lora is not None:
            gap = installed_adapter_gap()
            if gap is not None:
                raise UserError(f"{gap}: cannot hold a LoRA adapter; use merged sync")
            wanted.update(server_lora_args(lora))
        kwargs = only_known(wanted, fields)
        kwargs.update(engine_kwargs)
        kwargs.update(self._tp_setup(tensor_parallel_size, rank_order, fields))
        if self.leader_rank is None or self.leader_rank == _rank():
            self.engine = sglang.Engine(**kwargs)
        self.lora = lora
        self.adapter = None if lora is None else AdapterPublisher(self.engine, lora, str(model_path))
        self._release_weights = bool(kwargs.get("enable_weights_cpu_backup"))
        sampling = importlib.import_module("sglang.srt.sampling.sampling_params").SamplingParams
        self._sampling_fields = init_fields(sampling)
        self._tags = accepts(sglang.Engine.release_memory_occupation, "tags")
        self._regions = memory_regions()
        self._session = hasattr(sglang.Engine, "begin_weight_update") and self.engine is not None
        self.asleep_tags: set[str] = set()

    def log_prob_gap(
        self, *, temperature: float, top_p: float, top_k: int, greedy: bool = False
    ) -> str | None:
        """None when generate() returns ``log_softmax(logits / T)`` untruncated; else why not."""
        raw = [name for name in ORIGINAL_LOGPROB_ENV if os.environ.get(name, "").lower() in ("1", "true")]
        greedy = greedy or top_k == 1  # is_all_greedy: every request's top_k <= 1
        if (raw or greedy) and temperature != 1.0:
            why = f"{raw[0]} is set" if raw else ("greedy" if top_k != 1 else "top_k=1 is greedy to SGLang")
            return (
                f"sglang {self.version} log-probs are before temperature ({why}, temperature={temperature})"
            )
        return None

    @from_leader
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
        """Sample through SGLang; same keys as the HF engine (``rollout_log_probs`` only when exact).

        In-flight weight updates (:mod:`rlctl.engines.inflight`, :mod:`.sglang_inflight`): with
        ``version``, ``token_versions`` gives each response token's weight version; with ``swap``,
        requests decode ``swap_every`` tokens per call and ``swap()`` is asked between calls."""
        if self.asleep_tags:
            raise RunError("SGLang rollout engine is asleep; call wake() before generate()")
        if kv_on_swap not in KV_ON_SWAP:  # checked with or without a swap, as the HF engine does
            raise UserError(f"kv_on_swap must be one of {KV_ON_SWAP}, got {kv_on_swap!r}")
        if swap is not None and kv_on_swap != "recompute":
            raise UserError(keep_refusal(str(self.version)))
        if swap is not None and self.tp > 1:
            raise UserError("in-flight weight swaps on SGLang need rollout.tensor_parallel = 1")
        stop = stop_token_ids(eos_token_id)
        exact = self.log_prob_gap(temperature=temperature, top_p=top_p, top_k=top_k, greedy=greedy) is None
        prompts = unpadded_prompts(prompt_ids, prompt_mask, n)
        params = []
        for row_seed in row_seeds(seed, len(prompts)):
            wanted = {
                "temperature": 0.0 if greedy else temperature,
                "top_p": top_p,
                "top_k": top_k if top_k > 0 else -1,  # -1: whole vocabulary
                "max_new_tokens": max_new_tokens,
                "stop_token_ids": stop,
                "ignore_eos": not stop,
            }
            if row_seed is not None:
                wanted["sampling_seed"] = row_seed
            params.append(only_known(wanted, self._sampling_fields))
        def call(ids: list[list[int]], sampling: list[dict]) -> list[dict]:
            return self.engine.generate(
                input_ids=ids, sampling_params=sampling, return_logprob=exact, **self._lora_kwargs(len(ids))
            )

        current = 0 if version is None else int(version)
        if swap is not None:
            responses, reported, versions = generate_chunked(
                call, prompts, params, stop=stop, version=current, swap=swap,
                swap_every=self.swap_every, load=self.update_weights,
            )
        else:
            outputs = call(prompts, params)
            responses = [list(o["output_ids"]) for o in outputs]
            reported = [[float(lp) for lp, *_ in o["meta_info"]["output_token_logprobs"]] for o in outputs] if exact else []
            versions = [[current] * len(r) for r in responses]
        log_probs = reported if exact else None
        out = assemble_rollout(
            prompt_ids,
            prompt_mask,
            responses,
            log_probs,
            n=n,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad_token_id,
        )
        if version is not None:
            out["token_versions"] = padded_versions(versions, max_new_tokens)
        return out

    @from_leader
    def prompt_log_probs(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Log-prob of each token after the first given the ones before it, scored by SGLang itself
        (the weight-sync canary's rollout side).

        ``Engine.generate(input_ids, return_logprob=True, logprob_start_len=0)`` (0.5.3 and 0.5.23,
        ``sglang/srt/entrypoints/engine.py``) returns ``meta_info["input_token_logprobs"]``: one
        ``(logprob, token_id, text)`` per prompt token, the first logprob None
        (``managers/scheduler_output_processor_mixin.py`` 0.5.3,
        ``scheduler_components/logprob_result_processor.py`` 0.5.23; ``managers/tokenizer_manager.py``
        ``detokenize_logprob_tokens``). They are ``log_softmax`` of the logits, divided by the
        temperature only with ``temp_scaled_logprobs`` (``layers/logits_processor.py``): at
        temperature 1 rlctl's convention either way. The radix cache never covers positions whose
        log-probs are asked for (``schedule_batch.py``: the prefix is capped at
        ``logprob_start_len``), so the whole sequence is recomputed. One token is decoded.
        """
        if self.asleep_tags:
            raise RunError("SGLang rollout engine is asleep; call wake() before prompt_log_probs()")
        tokens = [int(t) for t in token_ids]
        params = only_known({"temperature": 1.0, "max_new_tokens": 1}, self._sampling_fields)
        (out,) = self.engine.generate(
            input_ids=[tokens],
            sampling_params=[params],
            return_logprob=True,
            logprob_start_len=0,
            **self._lora_kwargs(1),
        )
        entries = out["meta_info"]["input_token_logprobs"]
        if len(entries) != len(tokens):
            raise RunError(f"SGLang returned {len(entries)} prompt log-probs for {len(tokens)} tokens")
        return torch.tensor([float(lp) for lp, *_ in entries[1:]])

    def _lora_kwargs(self, n: int) -> dict:
        """``lora_path=`` the newest synced adapter's name per request (none before the first sync)."""
        name = None if self.adapter is None else self.adapter.name
        return {} if name is None else {"lora_path": [name] * n}

    def update_weights(self, stream: Iterable[tuple[str, torch.Tensor]]) -> int:
        """``update_weights_from_tensor`` per bucket inside a weight-update session where SGLang has one.

        The radix cache is flushed with the last bucket; every ``(success, message)`` is checked.
        """
        if "weights" in self.asleep_tags:
            self._resume(["weights"])
        count, pending = 0, None
        if self.adapter is not None:  # the adapter alone; modules_to_save copies into the base below
            lora_tensors, stream = split_adapter_stream(stream)
            if lora_tensors:
                self.adapter.publish(lora_tensors)
                count += len(lora_tensors)
            if not stream:
                return count
        if self._session:
            _checked(self.engine.begin_weight_update(), "begin_weight_update")
        try:
            if self.tp > 1:  # the replica's full tensors, one per TP scheduler (:mod:`.sglang_tp`)
                count += self.feed_replica(stream, lambda bucket, last: self._load(bucket, flush_cache=last))
            for bucket in bucketed(stream if self.tp == 1 else (), self.bucket_bytes):  # lookahead: flush on the last
                if pending is not None:
                    self._load(pending, flush_cache=False)
                pending, count = bucket, count + len(bucket)
            if pending is not None:
                self._load(pending, flush_cache=True)
        except BaseException:
            if self._session:  # close the session; the first error is the one to report
                self.engine.end_weight_update()
            raise
        if self._session:
            _checked(self.engine.end_weight_update(), "end_weight_update")
        return count

    def weight_fingerprint(self, spec: Sequence[tuple[str, tuple[int, ...]]], salt: int = 0) -> None:
        """None: SGLang offers no cheap read of its weights, so the sync check is not available.

        ``Engine.get_weights_by_name(name, truncate_size)`` (0.5.3 and 0.5.23,
        ``sglang/srt/entrypoints/engine.py``) is one request per tensor, copies the whole tensor
        to the host as a Python list before truncating it (``models/llama.py``: ``.tolist()[:n]``)
        and exists only on a few model classes (Llama, Granite, OPT, Exaone4; not Qwen2), and
        ``Engine.collective_rpc`` returns nothing.
        """
        return None

    def _load(self, bucket: list[tuple[str, torch.Tensor]], *, flush_cache: bool) -> None:
        result = self.engine.update_weights_from_tensor(
            named_tensors=bucket, load_format=None, flush_cache=flush_cache
        )
        _checked(result, "update_weights_from_tensor")

    def _resume(self, tags: list[str]) -> None:
        if self.engine is not None:  # at TP > 1 the replica's first rank holds the engine
            self.engine.resume_memory_occupation(tags=tags)
        self.asleep_tags -= set(tags)

    def sleep(self) -> None:
        """Release the KV cache and the CUDA-graph region (where the version has one), and the
        weights when SGLang keeps a CPU copy of them."""
        tags = [
            t
            for t in self._regions
            if t in FREED_WITHOUT_BACKUP or (t == "weights" and self._release_weights)
        ]
        if not self._tags:
            raise RunError(f"sglang {self.version} cannot release memory by tag; install sglang>=0.5.3")
        if self.engine is not None:
            self.engine.release_memory_occupation(tags=tags)
        self.asleep_tags = set(tags)

    def wake(self) -> None:
        """Resume what is still released (the weights unless an update already brought them back)."""
        if self.asleep_tags:
            self._resume(sorted(self.asleep_tags))
        self.asleep_tags = set()


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
