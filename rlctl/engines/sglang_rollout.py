"""SGLang rollout adapter (offline ``sglang.Engine``).

Written against the released SGLang source (paths inside the wheel, versions 0.5.3 and 0.5.23; the
recorded surfaces are ``tests/engines/surfaces/sglang-*.json``). Not yet run on NVIDIA hardware;
unit-tested against fakes built from those surfaces.

- ``Engine(**kw)`` builds ``ServerArgs(**kw)`` (a dataclass through 0.5.19, a msgspec struct
  assembled from ``sglang/srt/arg_groups/fields/`` from 0.5.20): an unknown keyword raises, so
  only fields of the installed ``ServerArgs`` are passed. ``flash_attention_2`` becomes
  ``attention_backend="fa3"`` (SGLang's FlashAttention backend); other choices keep SGLang's default.
- Sampling: one dict per request with its own ``sampling_seed`` (``sampling/sampling_params.py``,
  from 0.5.3). SGLang honours the seed only with ``enable_deterministic_inference`` (it then
  gives every unseeded request seed 42, ``sampling/sampling_batch_info.py``); without it the
  copies of a prompt still differ but a rerun does not repeat them.
- Log-probs (``layers/sampler.py``): ``log_softmax(logits / T)`` before top-k/top-p, rlctl's
  convention; an all-greedy batch (and ``SGLANG_RETURN_ORIGINAL_LOGPROB`` /
  ``RETURN_ORIGINAL_LOGPROB``) gives ``log_softmax(logits)``.
- Weights: ``update_weights_from_tensor`` returns ``(success, message)`` and never raises; from
  0.5.21 it must run between ``begin_weight_update()`` and ``end_weight_update()``
  (``managers/scheduler_components/weight_updater.py``), else it returns ``success=False``. Every
  result is checked.
- Memory: ``release_memory_occupation(tags)`` frees without a host copy unless
  ``enable_weights_cpu_backup`` (from 0.5.3); the adapter enables it and releases the weights only
  when it is there, else it releases just the KV cache (released weights come back as garbage).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Sequence

import torch

from rlctl.engines.external_version import accepts, init_fields, installed_version, only_known
from rlctl.engines.registry import register_engine
from rlctl.engines.rollout_batch import (
    assemble_rollout,
    bucketed,
    refuse_tensor_parallel,
    row_seeds,
    stop_token_ids,
    unpadded_prompts,
)
from rlctl.errors import RunError, UserError

# transformers attn_implementation -> SGLang attention_backend (sglang/srt/arg_groups/choices.py)
ATTENTION_BACKENDS = {"flash_attention_2": "fa3"}
ORIGINAL_LOGPROB_ENV = ("SGLANG_RETURN_ORIGINAL_LOGPROB", "RETURN_ORIGINAL_LOGPROB")


def _import_sglang():
    try:
        return importlib.import_module("sglang")
    except ImportError as exc:
        raise UserError(
            "rollout backend 'sglang' needs the sglang package (pip install 'rlctl[sglang]')"
        ) from exc


def _checked(result, what: str) -> None:
    """SGLang reports failure as ``(False, message)``; turn that into a RunError."""
    if isinstance(result, tuple | list) and result:
        success, message = result[0], result[1] if len(result) > 1 else ""
    else:
        success, message = getattr(result, "success", None), getattr(result, "message", "")
    if success is not True:
        raise RunError(f"SGLang {what} failed: {message or repr(result)}")


@register_engine("rollout", model_type="*", backend="sglang", device="cuda")
class SGLangRolloutEngine:
    """Same surface as :class:`~rlctl.engines.hf_rollout.HFRolloutEngine`, backed by ``sglang.Engine``."""

    def __init__(
        self,
        model_path: str,
        *,
        device: str = "cuda",
        dtype: str = "bfloat16",
        attn_implementation: str = "sdpa",
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.5,
        seed: int = 0,
        bucket_bytes: int = 256 << 20,
        **engine_kwargs,
    ):
        """``engine_kwargs`` go to ``sglang.Engine`` as given (for settings rlctl does not know)."""
        refuse_tensor_parallel(tensor_parallel_size, "SGLang")
        sglang = _import_sglang()
        self.version = installed_version("sglang")
        self.bucket_bytes = bucket_bytes
        server_args = importlib.import_module("sglang.srt.server_args").ServerArgs
        fields = init_fields(server_args)
        wanted: dict[str, object] = dict(
            model_path=str(model_path),
            dtype=dtype,
            tp_size=1,
            mem_fraction_static=gpu_memory_utilization,
            enable_memory_saver=True,
            enable_weights_cpu_backup=True,
            random_seed=seed,
            trust_remote_code=trust_remote_code,
            skip_tokenizer_init=True,
        )
        backend = ATTENTION_BACKENDS.get(attn_implementation)
        if backend is not None:
            wanted["attention_backend"] = backend
        kwargs = only_known(wanted, fields)
        kwargs.update(engine_kwargs)
        self.engine = sglang.Engine(**kwargs)
        self._release_weights = bool(kwargs.get("enable_weights_cpu_backup"))
        sampling = importlib.import_module("sglang.srt.sampling.sampling_params").SamplingParams
        self._sampling_fields = init_fields(sampling)
        self._tags = accepts(self.engine.release_memory_occupation, "tags")
        self._session = hasattr(self.engine, "begin_weight_update")
        self.asleep_tags: set[str] = set()

    def log_prob_gap(
        self, *, temperature: float, top_p: float, top_k: int, greedy: bool = False
    ) -> str | None:
        """None when generate() returns ``log_softmax(logits / T)`` untruncated; else why not."""
        raw = [name for name in ORIGINAL_LOGPROB_ENV if os.environ.get(name, "").lower() in ("1", "true")]
        if (raw or greedy) and temperature != 1.0:
            why = f"{raw[0]} is set" if raw else "greedy"
            return (
                f"sglang {self.version} log-probs are before temperature ({why}, temperature={temperature})"
            )
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
    ) -> dict[str, torch.Tensor]:
        """Sample through SGLang; same keys as the HF engine (``rollout_log_probs`` only when exact)."""
        if self.asleep_tags:
            raise RunError("SGLang rollout engine is asleep; call wake() before generate()")
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
        outputs = self.engine.generate(input_ids=prompts, sampling_params=params, return_logprob=exact)
        responses = [list(o["output_ids"]) for o in outputs]
        log_probs = None
        if exact:
            log_probs = [
                [float(lp) for lp, _tok, *_ in o["meta_info"]["output_token_logprobs"]] for o in outputs
            ]
        return assemble_rollout(
            prompt_ids,
            prompt_mask,
            responses,
            log_probs,
            n=n,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad_token_id,
        )

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
            input_ids=[tokens], sampling_params=[params], return_logprob=True, logprob_start_len=0
        )
        entries = out["meta_info"]["input_token_logprobs"]
        if len(entries) != len(tokens):
            raise RunError(f"SGLang returned {len(entries)} prompt log-probs for {len(tokens)} tokens")
        return torch.tensor([float(lp) for lp, *_ in entries[1:]])

    def update_weights(self, stream: Iterable[tuple[str, torch.Tensor]]) -> int:
        """``update_weights_from_tensor`` per bucket inside a weight-update session where SGLang has one.

        The radix cache is flushed with the last bucket; every ``(success, message)`` is checked.
        """
        if "weights" in self.asleep_tags:
            self._resume(["weights"])
        if self._session:
            _checked(self.engine.begin_weight_update(), "begin_weight_update")
        count, pending = 0, None
        try:
            for bucket in bucketed(stream, self.bucket_bytes):  # one bucket of lookahead: flush on the last
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

    def weight_fingerprint(self, spec: Sequence[tuple[str, tuple[int, ...]]]) -> None:
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
        self.engine.resume_memory_occupation(tags=tags)
        self.asleep_tags -= set(tags)

    def sleep(self) -> None:
        """Release the KV cache, and the weights when SGLang keeps a CPU copy of them."""
        tags = ["kv_cache", "weights"] if self._release_weights else ["kv_cache"]
        if not self._tags:
            raise RunError(f"sglang {self.version} cannot release memory by tag; install sglang>=0.5.3")
        self.engine.release_memory_occupation(tags=tags)
        self.asleep_tags = set(tags)

    def wake(self) -> None:
        """Resume what is still released (the weights unless an update already brought them back)."""
        if self.asleep_tags:
            self._resume(sorted(self.asleep_tags))
        self.asleep_tags = set()
