"""Fake ``vllm`` and ``sglang`` modules shaped after their public offline APIs.

Only the surface the adapters touch is modelled: ``vllm.LLM`` (generate with token-id prompts and
``SamplingParams(logprobs=0)``, sleep/wake_up, collective_rpc into a worker extension,
reset_prefix_cache), ``vllm.SamplingParams``; ``sglang.Engine`` (generate with input_ids and
return_logprob, update_weights_from_tensor, release/resume_memory_occupation). Generation is done
by a real HF model so log-probs and weight updates can be checked numerically; prompts arrive
unpadded, as the real engines expect. Every call is recorded in ``calls``.
"""

from __future__ import annotations

import importlib
import types

import torch

from rlctl.engines.hf_rollout import HFRolloutEngine


class _HFModelWithLoadWeights:
    """Stands in for a vLLM model: ``load_weights(weights) -> set of loaded names``."""

    def __init__(self, engine: HFRolloutEngine):
        self.engine = engine

    def load_weights(self, weights):
        names = set()
        for name, tensor in weights:
            self.engine.update_weights([(name, tensor)])
            names.add(name)
        return names


def _run(engine: HFRolloutEngine, prompt: list[int], temperature, top_p, top_k, max_tokens, stop, seed):
    """One request through the HF engine; returns (token_ids, log-probs) up to and incl. the stop."""
    assert all(isinstance(t, int) for t in prompt) and prompt, "prompts must be plain unpadded token lists"
    ids = torch.tensor([prompt])
    greedy = temperature == 0.0
    out = engine.generate(
        ids,
        torch.ones_like(ids),
        temperature=1.0 if greedy else temperature,
        top_p=top_p,
        top_k=max(top_k, 0),
        max_new_tokens=max_tokens,
        greedy=greedy,
        eos_token_id=stop or None,
        generator=torch.Generator().manual_seed(seed or 0),
    )
    length = int(out["response_mask"].sum())
    return out["responses"][0, :length].tolist(), out["rollout_log_probs"][0, :length].tolist()


def make_fake_vllm(calls: list, reject_logprobs_mode: bool = False) -> types.ModuleType:
    vllm = types.ModuleType("vllm")

    class Logprob:
        def __init__(self, logprob: float, rank: int | None = None, decoded_token: str | None = None):
            self.logprob, self.rank, self.decoded_token = logprob, rank, decoded_token

    class SamplingParams:
        def __init__(self, **kwargs):
            self.__dict__.update(kwargs)

    class CompletionOutput:
        def __init__(self, token_ids, logprobs):
            self.index, self.token_ids, self.logprobs, self.text = 0, token_ids, logprobs, ""

    class RequestOutput:
        def __init__(self, prompt_token_ids, outputs):
            self.prompt_token_ids, self.outputs = prompt_token_ids, outputs

    class Worker:
        def __init__(self, engine):
            self.model_runner = types.SimpleNamespace(model=_HFModelWithLoadWeights(engine))

    class LLM:
        def __init__(self, model: str, **kwargs):
            if reject_logprobs_mode and "logprobs_mode" in kwargs:
                raise TypeError("EngineArgs.__init__() got an unexpected keyword argument 'logprobs_mode'")
            calls.append(("LLM", kwargs))
            self.hf = HFRolloutEngine(model)
            module, cls = kwargs["worker_extension_cls"].rsplit(".", 1)
            ext = getattr(importlib.import_module(module), cls)
            self.worker = type("WorkerWithExtension", (Worker, ext), {})(self.hf)

        def generate(self, prompts, sampling_params, use_tqdm=True):
            sp = sampling_params
            calls.append(("generate", [p["prompt_token_ids"] for p in prompts], sp.__dict__))
            assert sp.logprobs == 0 and sp.n == 1
            results = []
            for i, p in enumerate(prompts):
                toks, lps = _run(
                    self.hf,
                    p["prompt_token_ids"],
                    sp.temperature,
                    sp.top_p,
                    sp.top_k,
                    sp.max_tokens,
                    sp.stop_token_ids,
                    (sp.seed or 0) + i,
                )
                logprobs = [{t: Logprob(lp, rank=1)} for t, lp in zip(toks, lps, strict=True)]
                results.append(RequestOutput(p["prompt_token_ids"], [CompletionOutput(toks, logprobs)]))
            return results

        def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            calls.append(("collective_rpc", method, len(args[0])))
            return [getattr(self.worker, method)(*args, **(kwargs or {}))]

        def reset_prefix_cache(self):
            calls.append(("reset_prefix_cache",))
            return True

        def sleep(self, level: int = 1):
            calls.append(("sleep", level))

        def wake_up(self, tags=None):
            calls.append(("wake_up", tags))

    vllm.LLM, vllm.SamplingParams, vllm.Logprob = LLM, SamplingParams, Logprob
    return vllm


def make_fake_sglang(calls: list) -> types.ModuleType:
    sglang = types.ModuleType("sglang")

    class Engine:
        def __init__(self, **kwargs):
            calls.append(("Engine", kwargs))
            self.hf = HFRolloutEngine(kwargs["model_path"])

        def generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False, **kw):
            sp = sampling_params
            calls.append(("generate", input_ids, dict(sp)))
            assert return_logprob
            out = []
            for i, ids in enumerate(input_ids):
                toks, lps = _run(
                    self.hf,
                    ids,
                    sp["temperature"],
                    sp["top_p"],
                    sp["top_k"],
                    sp["max_new_tokens"],
                    sp["stop_token_ids"],
                    sp.get("sampling_seed", 0) + i,
                )
                meta = {"output_token_logprobs": [(lp, t, None) for t, lp in zip(toks, lps, strict=True)]}
                out.append({"text": "", "output_ids": toks, "meta_info": meta})
            return out

        def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
            calls.append(("update_weights_from_tensor", len(named_tensors), flush_cache))
            self.hf.update_weights(named_tensors)
            return True, "Succeeded to update model weights."

        def release_memory_occupation(self, tags=None):
            calls.append(("release_memory_occupation", tags))

        def resume_memory_occupation(self, tags=None):
            calls.append(("resume_memory_occupation", tags))

    sglang.Engine = Engine
    return sglang
