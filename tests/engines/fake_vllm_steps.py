"""vLLM's offline engine loop, faked: ``LLMEngine.add_request`` / ``step`` / ``has_unfinished_requests``
/ ``abort_request`` and ``reset_prefix_cache(reset_running_requests=True)``'s preemption.

Signatures as in ``vllm/v1/engine/llm_engine.py`` of each release (an unknown keyword is Python's
``TypeError``): ``add_request(request_id, prompt, params, arrival_time=None, lora_request=None,
tokenization_kwargs=None, trace_headers=None, priority=0)`` in 0.10.2, ``+ prompt_text=None`` in
0.13.0, ``+ session_id=None, prompt_text=None, kv_hints=None`` in 0.33.0; ``abort_request(request_ids)``
(0.33.0: ``+ internal=False``). Behaviour as the sources say:

- one ``step()`` decodes one token for every running request (``stream_interval`` 1) and returns a
  ``RequestOutput`` per request with its tokens and log-probs so far (``output_kind`` CUMULATIVE,
  the ``SamplingParams`` default; ``vllm/sampling_params.py``);
- each request keeps its own KV cache between steps, computed by the weights in place when each
  token went in: a weight load between steps leaves it as it is;
- ``reset_prefix_cache(reset_running_requests=True)`` (0.13.0, 0.33.0
  ``v1/core/sched/scheduler.py``) preempts every running request: its cache is freed and
  ``num_computed_tokens = 0``, so its next step recomputes prompt + output under the weights then in
  place. 0.10.2's ``reset_prefix_cache(device=None)`` has no such argument (the recorded surface).
"""

from __future__ import annotations

import types

import torch

from rlctl.engines.hf_model import cache_kwarg, output_cache
from rlctl.engines.sampling import filter_top_k_top_p

_EPS = 1e-5


class _Request:
    def __init__(self, rid: str, prompt: list[int], sp, lora_request):
        self.rid, self.prompt, self.sp, self.lora_request = rid, prompt, sp, lora_request
        self.tokens: list[int] = []
        self.logprobs: list[dict] = []
        self.cache = None  # None: nothing computed (new or preempted)
        self.gen = torch.Generator().manual_seed(0 if sp.seed is None else int(sp.seed))
        self.finished = False


def attach(engine, llm, rel: tuple[int, ...], score, Logprob, CompletionOutput, calls: list) -> None:
    """Give the fake ``llm.llm_engine`` (``engine``) the release's step-loop methods over ``llm.hf``.
    ``score(logits, tokens, sp)``: the log-probs vLLM reports for ``tokens`` (its logprobs mode)."""
    engine.requests = {}

    def _add(self, request_id, prompt, params, lora_request=None):
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a string, got {type(request_id)}")
        assert params.n == 1
        self.requests[request_id] = _Request(
            request_id, list(prompt["prompt_token_ids"]), params, lora_request
        )
        calls.append(("add_request", request_id))

    if rel >= (0, 33):

        def add_request(
            self,
            request_id,
            prompt,
            params,
            arrival_time=None,
            lora_request=None,
            tokenization_kwargs=None,
            trace_headers=None,
            priority=0,
            session_id=None,
            prompt_text=None,
            kv_hints=None,
        ):
            _add(self, request_id, prompt, params, lora_request)
            return request_id

        def abort_request(self, request_ids, internal=False):
            for rid in request_ids:
                self.requests.pop(rid, None)
    elif rel >= (0, 13):

        def add_request(
            self,
            request_id,
            prompt,
            params,
            arrival_time=None,
            lora_request=None,
            tokenization_kwargs=None,
            trace_headers=None,
            priority=0,
            prompt_text=None,
        ):
            _add(self, request_id, prompt, params, lora_request)

        def abort_request(self, request_ids):
            for rid in request_ids:
                self.requests.pop(rid, None)
    else:

        def add_request(
            self,
            request_id,
            prompt,
            params,
            arrival_time=None,
            lora_request=None,
            tokenization_kwargs=None,
            trace_headers=None,
            priority=0,
        ):
            _add(self, request_id, prompt, params, lora_request)

        def abort_request(self, request_ids):
            for rid in request_ids:
                self.requests.pop(rid, None)

    def has_unfinished_requests(self):
        return any(not r.finished for r in self.requests.values())

    def step(self):
        if llm.sleeping:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (engine asleep)")
        calls.append(("step",))
        outputs = []
        for req in [r for r in self.requests.values() if not r.finished]:
            llm.lora.use(req.lora_request)
            logits = _forward(llm.hf.model, req)
            sp = req.sp
            greedy = sp.temperature < _EPS
            if greedy:
                tok = int(logits.argmax())
            else:
                probs = torch.softmax(
                    filter_top_k_top_p(logits[None] / sp.temperature, max(sp.top_k, 0), sp.top_p), -1
                )
                tok = int(torch.multinomial(probs[0], 1, generator=req.gen))
            req.tokens.append(tok)
            if sp.logprobs is not None:
                (value,) = score(logits[None], [tok], sp)
                req.logprobs.append({tok: Logprob(value, rank=1)})
            stops = [] if sp.ignore_eos and not sp.stop_token_ids else list(sp.stop_token_ids or [])
            req.finished = tok in stops or len(req.tokens) >= sp.max_tokens
            completion = CompletionOutput(
                list(req.tokens), list(req.logprobs) if sp.logprobs is not None else None
            )
            out = types.SimpleNamespace(request_id=req.rid, outputs=[completion], finished=req.finished)
            outputs.append(out)
            if req.finished:
                del self.requests[req.rid]
        return outputs

    def preempt_running(self):
        """``Scheduler.reset_prefix_cache(reset_running_requests=True)``: every running request's
        cache freed, recomputed from prompt + output at its next step."""
        calls.append(("preempt", len(self.requests)))
        for req in self.requests.values():
            req.cache = None

    for fn in (add_request, abort_request, has_unfinished_requests, step, preempt_running):
        setattr(engine, fn.__name__, types.MethodType(fn, engine))


@torch.no_grad()
def _forward(model, req: _Request) -> torch.Tensor:
    """The next-token logits of ``req``: its whole sequence when nothing is cached, else its last token
    over the cache kept from earlier steps (whatever weights computed it)."""
    if req.cache is None:
        ids = torch.tensor([req.prompt + req.tokens])
        out = model(input_ids=ids, use_cache=True)
    else:
        pos = torch.tensor([[len(req.prompt) + len(req.tokens) - 1]])
        kw = {cache_kwarg(model): req.cache}
        out = model(input_ids=torch.tensor([[req.tokens[-1]]]), position_ids=pos, use_cache=True, **kw)
    req.cache = output_cache(out)
    return out.logits[0, -1].float()
