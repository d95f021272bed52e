"""SGLang rollout adapter (offline ``sglang.Engine``), written against SGLang's documented API.

Not runnable here (no SGLang, no GPU); unit-tested with a fake ``sglang`` module shaped after the
real one. Uses ``Engine(model_path=..., enable_memory_saver=True)``, ``Engine.generate(input_ids=,
sampling_params=, return_logprob=True)`` (``meta_info["output_token_logprobs"]`` holds
``(logprob, token_id, text)`` per generated token), ``update_weights_from_tensor(named_tensors,
load_format=None, flush_cache=True)`` and ``release_memory_occupation`` /
``resume_memory_occupation``. Log-prob temperature convention: as SGLang reports it (see the
vLLM adapter's note); the training engine recomputes old log-probs either way.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence

import torch

from rlctl.engines.registry import register_engine
from rlctl.engines.rollout_batch import assemble_rollout, bucketed, stop_token_ids, unpadded_prompts
from rlctl.errors import RunError, UserError


def _import_sglang():
    try:
        return importlib.import_module("sglang")
    except ImportError as exc:
        raise UserError(
            "rollout backend 'sglang' needs the sglang package (pip install 'rlctl[sglang]')"
        ) from exc


@register_engine("rollout", model_type="*", backend="sglang", device="cuda")
class SGLangRolloutEngine:
    """Same surface as :class:`~rlctl.engines.hf_rollout.HFRolloutEngine`, backed by ``sglang.Engine``."""

    def __init__(
        self,
        model_path: str,
        *,
        device: str = "cuda",
        dtype: str = "bfloat16",
        tensor_parallel_size: int = 1,
        mem_fraction_static: float = 0.5,
        seed: int = 0,
        trust_remote_code: bool = False,
        bucket_bytes: int = 256 << 20,
        **engine_kwargs,
    ):
        sglang = _import_sglang()
        self.bucket_bytes = bucket_bytes
        kwargs = dict(
            model_path=str(model_path),
            dtype=dtype,
            tp_size=tensor_parallel_size,
            mem_fraction_static=mem_fraction_static,
            enable_memory_saver=True,
            random_seed=seed,
            trust_remote_code=trust_remote_code,
            skip_tokenizer_init=True,
        )
        kwargs.update(engine_kwargs)
        self.engine = sglang.Engine(**kwargs)
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
        """Sample through SGLang; returns the same keys as the HF engine."""
        if self.asleep_tags:
            raise RunError("SGLang rollout engine is asleep; call wake() before generate()")
        stop = stop_token_ids(eos_token_id)
        params = {
            "temperature": 0.0 if greedy else temperature,
            "top_p": top_p,
            "top_k": top_k if top_k > 0 else -1,
            "max_new_tokens": max_new_tokens,
            "stop_token_ids": stop,
            "ignore_eos": not stop,
        }
        if generator is not None:
            params["sampling_seed"] = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        outputs = self.engine.generate(
            input_ids=unpadded_prompts(prompt_ids, prompt_mask, n),
            sampling_params=params,
            return_logprob=True,
        )
        responses = [list(o["output_ids"]) for o in outputs]
        log_probs = [[float(lp) for lp, _tok, *_ in o["meta_info"]["output_token_logprobs"]] for o in outputs]
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
        """``update_weights_from_tensor`` per bucket; the radix cache is flushed after the last one."""
        if "weights" in self.asleep_tags:
            self.engine.resume_memory_occupation(tags=["weights"])
            self.asleep_tags.discard("weights")
        count, pending = 0, None
        for bucket in bucketed(stream, self.bucket_bytes):  # one bucket of lookahead: flush on the last
            if pending is not None:
                self.engine.update_weights_from_tensor(
                    named_tensors=pending, load_format=None, flush_cache=False
                )
            pending, count = bucket, count + len(bucket)
        if pending is not None:
            self.engine.update_weights_from_tensor(named_tensors=pending, load_format=None, flush_cache=True)
        return count

    def sleep(self) -> None:
        """Release weights and KV cache memory (SGLang's memory saver)."""
        self.engine.release_memory_occupation(tags=["weights", "kv_cache"])
        self.asleep_tags = {"weights", "kv_cache"}

    def wake(self) -> None:
        """Resume what is still released (the weights unless an update already brought them back)."""
        if self.asleep_tags:
            self.engine.resume_memory_occupation(tags=sorted(self.asleep_tags))
        self.asleep_tags = set()
