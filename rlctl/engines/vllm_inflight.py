"""In-flight weight swaps for the vLLM rollout engine (:mod:`rlctl.engines.inflight`'s contract).

Read from the released source (vllm 0.13.0 and 0.33.0 wheels; 0.10.2 where said):

- The offline ``LLM.generate`` is ``_validate_and_add_requests`` then ``_run_engine``: ``while
  llm_engine.has_unfinished_requests(): llm_engine.step()`` (``vllm/entrypoints/llm.py``). rlctl
  drives that loop itself: ``llm.llm_engine.add_request(request_id, {"prompt_token_ids": ...},
  params, lora_request=...)`` and ``step()`` (``vllm/v1/engine/llm_engine.py``), asking ``swap()``
  between steps. With the in-process engine core (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the
  adapter's setting) ``step()`` runs the scheduler and the forward synchronously
  (``v1/engine/core_client.py`` ``InprocClient.get_output`` -> ``engine_core.step_fn()``), so nothing
  runs between two calls and ``collective_rpc`` loads the new weights in place there. Async
  scheduling (``EngineArgs.async_scheduling``; default False in 0.13.0, None = on where supported
  in 0.33.0) may leave a batch in flight when ``step()`` returns (``v1/engine/core.py``
  ``step_with_batch_queue``), so a swap is refused unless it is off.
- ``AsyncLLM.pause_generation`` (abort / keep / wait modes in 0.33.0, ``v1/engine/async_llm.py``)
  serves the API server's event loop; the offline ``LLM`` has no pause, and needs none: the step
  loop is the pause.
- ``SamplingParams.output_kind`` defaults to ``CUMULATIVE`` (``vllm/sampling_params.py``;
  ``LLM.generate`` sets ``FINAL_ONLY``): each ``step()`` returns every request that produced a token,
  with its tokens and log-probs so far, which is what attributes each token to a weight version.
- KV cache of the running requests at a swap (``kv_on_swap``):
  ``keep``: nothing is touched; later tokens attend to keys and values computed by the old weights
  (PipelineRL's choice), their log-probs are what vLLM reports, the scores of neither policy.
  ``recompute``: ``LLM.reset_prefix_cache(reset_running_requests=True)`` (0.13.0 and 0.33.0;
  absent in 0.10.2, refused there) preempts every running request (``v1/core/sched/scheduler.py``
  ``reset_prefix_cache`` -> ``_preempt_request``: blocks freed, ``num_computed_tokens = 0``, back to
  the waiting queue) and clears the prefix cache, so the next step recomputes prompt + output so far
  under the new weights: each later token's log-prob is the new weights' score of it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from rlctl.engines.external_version import accepts
from rlctl.engines.inflight import KV_ON_SWAP, Swap

_request_ids = itertools.count()


def swap_gap(
    llm, version: str, kv_on_swap: str, *, async_scheduling: object, stream_interval: object = 1, tp: int = 1
) -> str | None:
    """None when this vLLM can swap weights between decode steps as asked; else why not (one line).

    ``stream_interval`` (``EngineArgs``, default 1 in 0.13.0 and 0.33.0, absent in 0.10.2) above 1
    reports a request's tokens only every that many (``v1/engine/output_processor.py``), so the
    tokens sampled before a swap could not be told from those after it: refused."""
    if kv_on_swap not in KV_ON_SWAP:
        return f"kv_on_swap must be one of {KV_ON_SWAP}, got {kv_on_swap!r}"
    if tp > 1:  # every TP rank would have to take the same swap at the same step: not built
        return "in-flight weight swaps on vLLM need rollout.tensor_parallel = 1"
    engine = getattr(llm, "llm_engine", None)
    missing = [m for m in ("add_request", "step", "has_unfinished_requests") if not hasattr(engine, m)]
    if missing:
        return f"vllm {version} has no LLMEngine.{missing[0]}: cannot swap weights between decode steps"
    if stream_interval not in (None, 1):
        return (
            f"vllm {version} with stream_interval={stream_interval!r} reports tokens in groups; "
            "in-flight weight swaps need stream_interval = 1"
        )
    if async_scheduling is not False:
        return (
            f"vllm {version} with async_scheduling={async_scheduling!r} may have a batch in flight between "
            "steps; set rollout.engine_kwargs.async_scheduling = false for in-flight weight swaps"
        )
    if kv_on_swap == "recompute" and not accepts(llm.reset_prefix_cache, "reset_running_requests"):
        return (
            f"vllm {version} cannot recompute running requests' KV cache on a swap "
            "(LLM.reset_prefix_cache has no reset_running_requests); use kv_on_swap='keep'"
        )
    return None


def generate_stepped(
    llm,
    prompts: Sequence[list[int]],
    params: Sequence[object],
    *,
    version: int,
    swap: Swap | None,
    kv_on_swap: str,
    load: Callable[[object], int],
    lora_kwargs: dict,
) -> tuple[list[list[int]], list[list | None], list[list[int]]]:
    """Run the requests through ``llm.llm_engine`` step by step, swapping weights when ``swap()`` says.

    Returns per request (in ``prompts``' order) its token ids, its ``CompletionOutput.logprobs`` (None
    where not asked) and the weight version of each token. ``load(stream)`` puts the new weights in.
    """
    engine = llm.llm_engine
    ids = [f"rlctl-inflight-{next(_request_ids)}" for _ in prompts]
    for rid, prompt, sp in zip(ids, prompts, params, strict=True):
        engine.add_request(rid, {"prompt_token_ids": list(prompt)}, sp, **lora_kwargs)
    seen = dict.fromkeys(ids, 0)  # tokens reported so far per request
    marks: dict[str, list[tuple[int, int]]] = {rid: [(0, version)] for rid in ids}  # (from token, version)
    final: dict[str, object] = {}
    current = version
    try:
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id in seen:
                    seen[out.request_id] = len(out.outputs[0].token_ids)
                    if out.finished:
                        final[out.request_id] = out.outputs[0]
            running = [rid for rid in ids if rid not in final]
            if swap is None or not running or (new := swap()) is None:
                continue
            current = int(new[0])
            load(new[1])
            if kv_on_swap == "recompute":
                llm.reset_prefix_cache(reset_running_requests=True)
            for rid in running:
                marks[rid].append((seen[rid], current))
    except BaseException:  # a failed swap or step: leave no request behind for the next generate
        engine.abort_request([rid for rid in ids if rid not in final])
        raise
    tokens, log_probs, versions = [], [], []
    for rid in ids:
        completion = final[rid]
        toks = list(completion.token_ids)
        tokens.append(toks)
        log_probs.append(completion.logprobs)
        versions.append(_versions_of(len(toks), marks[rid]))
    return tokens, log_probs, versions


def _versions_of(length: int, marks: list[tuple[int, int]]) -> list[int]:
    """Token ``t``'s version: that of the last swap made when the request had at most ``t`` tokens."""
    out = []
    for t in range(length):
        out.append([v for start, v in marks if start <= t][-1])
    return out
