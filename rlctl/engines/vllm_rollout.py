"""vLLM rollout adapter (colocated offline ``vllm.LLM``), written against vLLM's documented API.

Not runnable in this workplace (no vLLM, no GPU): it is unit-tested with a fake ``vllm`` module
shaped after the real one. What it uses:

- ``LLM(model=..., enable_sleep_mode=True, worker_extension_cls=...)``; ``LLM.generate`` with
  token-id prompts and ``SamplingParams(logprobs=0)`` (the sampled token's log-prob).
- ``llm.sleep(level)`` / ``llm.wake_up(tags)``; weights are loaded in place through
  ``llm.collective_rpc`` into :class:`RlctlWorkerExtension`, which calls the model runner's
  ``model.load_weights`` with HF names (vLLM merges q/k/v and gate/up itself).

Log-probs: vLLM returns raw (temperature-free) log-probs unless ``logprobs_mode`` says otherwise;
the adapter asks for ``processed_logprobs`` (vLLM >= 0.10.2), which are under the sampling
temperature but, in recent vLLM, also after top-k/top-p truncation, so with truncation on they
differ from the HF engine's untruncated convention. The training engine recomputes old log-probs
either way. The in-place weight path passes tensors through ``collective_rpc`` and so needs the
workers in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, tensor parallel size 1); TP > 1 needs an
IPC/NCCL transfer (the reshard package) and is not wired here.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Sequence

import torch

from rlctl.engines.registry import register_engine
from rlctl.engines.rollout_batch import assemble_rollout, bucketed, stop_token_ids, unpadded_prompts
from rlctl.errors import RunError, UserError

EXTENSION = "rlctl.engines.vllm_rollout.RlctlWorkerExtension"


class RlctlWorkerExtension:
    """Mixed into each vLLM worker (``worker_extension_cls``); reached via ``collective_rpc``."""

    def rlctl_load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> int:
        """Load HF-named tensors into the worker's model in place; returns how many were given."""
        self.model_runner.model.load_weights(weights=weights)
        return len(weights)


def _import_vllm():
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise UserError("rollout backend 'vllm' needs the vllm package (pip install 'rlctl[vllm]')") from exc


@register_engine("rollout", model_type="*", backend="vllm", device="cuda")
class VLLMRolloutEngine:
    """Same surface as :class:`~rlctl.engines.hf_rollout.HFRolloutEngine`, backed by ``vllm.LLM``."""

    def __init__(
        self,
        model_path: str,
        *,
        device: str = "cuda",
        dtype: str = "bfloat16",
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.5,
        seed: int = 0,
        trust_remote_code: bool = False,
        bucket_bytes: int = 256 << 20,
        **llm_kwargs,
    ):
        vllm = _import_vllm()
        self._vllm = vllm
        self.bucket_bytes = bucket_bytes
        if tensor_parallel_size == 1:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        kwargs = dict(
            model=str(model_path),
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
        kwargs.update(llm_kwargs)
        try:
            self.llm = vllm.LLM(**kwargs)
        except TypeError as exc:  # vLLM before logprobs_mode: raw log-probs, see module doc
            if "logprobs_mode" not in str(exc):
                raise
            kwargs.pop("logprobs_mode")
            self.llm = vllm.LLM(**kwargs)
        self.asleep_tags: set[str] = set()

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
        generator: torch.Generator | None = None,
    ) -> dict[str, torch.Tensor]:
        """Sample through vLLM; returns the same keys as the HF engine."""
        if self.asleep_tags:
            raise RunError("vLLM rollout engine is asleep; call wake() before generate()")
        stop = stop_token_ids(eos_token_id)
        seed = None if generator is None else int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        params = self._vllm.SamplingParams(
            n=1,
            temperature=0.0 if greedy else temperature,
            top_p=top_p,
            top_k=top_k if top_k > 0 else -1,
            max_tokens=max_new_tokens,
            logprobs=0,
            stop_token_ids=stop,
            ignore_eos=not stop,
            seed=seed,
            detokenize=False,
        )
        prompts = [{"prompt_token_ids": p} for p in unpadded_prompts(prompt_ids, prompt_mask, n)]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        responses, log_probs = [], []
        for request in outputs:
            completion = request.outputs[0]
            tokens = list(completion.token_ids)
            responses.append(tokens)
            log_probs.append(
                [step[tok].logprob for step, tok in zip(completion.logprobs, tokens, strict=True)]
            )
        return assemble_rollout(
            prompt_ids,
            prompt_mask,
            responses,
            log_probs,
            n=n,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad_token_id,
        )

    def update_weights(self, stream: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load HF-named tensors in buckets through ``collective_rpc``; drops the prefix cache."""
        if "weights" in self.asleep_tags:
            self.llm.wake_up(tags=["weights"])
            self.asleep_tags.discard("weights")
        count = 0
        for bucket in bucketed(stream, self.bucket_bytes):
            results = self.llm.collective_rpc("rlctl_load_weights", args=(bucket,))
            count += int(results[0])
        self.llm.reset_prefix_cache()
        return count

    def sleep(self, level: int = 1) -> None:
        """Level 1: weights to CPU, KV cache dropped; level 2: both dropped (reload required)."""
        self.llm.sleep(level=level)
        self.asleep_tags = {"weights", "kv_cache"}

    def wake(self) -> None:
        """Restore what is still asleep: the weights (unless an update woke them) and the KV cache."""
        if self.asleep_tags:
            self.llm.wake_up(tags=sorted(self.asleep_tags))
        self.asleep_tags = set()
