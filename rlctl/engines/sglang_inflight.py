"""In-flight weight swaps for the SGLang rollout engine (:mod:`rlctl.engines.inflight`'s contract).

Read from the released source (sglang 0.5.3 and 0.5.23 wheels):

- The offline ``Engine.generate`` blocks on ``loop.run_until_complete`` until the whole batch is
  done, the scheduler in another process (``sglang/srt/entrypoints/engine.py``), and ``Engine`` has
  no ``pause_generation`` in either release. ``TokenizerManager.pause_generation`` (0.5.3: aborts
  everything; 0.5.23: modes ``abort``, ``retract`` (requests back to the waiting queue, KV recomputed
  after ``continue_generation``) and ``in_place`` (old KV cache kept; ``flush_cache`` then fails),
  ``managers/io_struct.py`` ``PauseGenerationReqInput``) serves the HTTP server's event loop.
- So rlctl cuts the generation itself: each request decodes at most ``swap_every`` tokens per
  ``Engine.generate`` call, ``swap()`` is asked between calls, and an unfinished request goes on in
  the next call as prompt + its tokens so far (``input_ids``), the rest of its budget as
  ``max_new_tokens``. Without a swap the radix cache already holds that prefix (prefix matching,
  ``mem_cache/radix_cache.py``), so only the call overhead is paid. A swap is
  ``update_weights_from_tensor(..., flush_cache=True)`` on its last bucket (inside
  ``begin/end_weight_update`` from 0.5.21): the radix cache is flushed, and the next call prefills
  prompt + tokens so far under the new weights (``kv_on_swap="recompute"``: each later token's
  log-prob is the new weights' score of it). ``keep`` is refused: each call is a new request, so
  the old KV cache could only survive as unflushed radix-cache entries, which SGLang may evict.
- Each call's requests get their own ``sampling_seed`` (the row's seed mixed with the call's index),
  so a continued request does not replay the random stream of its first call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rlctl.engines.inflight import Swap

SEED_MIX = 1_000_003


def keep_refusal(version: str) -> str:
    """Why ``kv_on_swap='keep'`` is not offered on SGLang (one line)."""
    return (
        f"sglang {version} cannot keep the old KV cache across an in-flight swap (each continued request "
        "is new; the radix cache is flushed with the weights); use kv_on_swap='recompute'"
    )


def generate_chunked(
    generate: Callable[[list[list[int]], list[dict]], list[dict]],
    prompts: Sequence[list[int]],
    params: Sequence[dict],
    *,
    stop: Sequence[int],
    version: int,
    swap: Swap,
    swap_every: int,
    load: Callable[[object], int],
) -> tuple[list[list[int]], list[list[float]], list[list[int]]]:
    """Decode ``prompts`` in calls of at most ``swap_every`` tokens, asking ``swap()`` between calls.

    ``generate(input_ids, sampling_params)`` is one ``Engine.generate`` call (its dicts' outputs);
    ``params[i]`` is request ``i``'s sampling dict with its total ``max_new_tokens``. Returns per
    request its tokens, the log-probs SGLang reported for them and each token's weight version.
    """
    if swap_every < 1:
        raise ValueError(f"swap_every must be >= 1, got {swap_every}")
    stops = set(stop)
    tokens: list[list[int]] = [[] for _ in prompts]
    log_probs: list[list[float]] = [[] for _ in prompts]
    versions: list[list[int]] = [[] for _ in prompts]
    running = list(range(len(prompts)))
    current, call = version, 0
    while running:
        batch, sampling = [], []
        for i in running:
            left = int(params[i]["max_new_tokens"]) - len(tokens[i])
            p = dict(params[i], max_new_tokens=min(swap_every, left))
            if "sampling_seed" in p and call:
                p["sampling_seed"] = (int(p["sampling_seed"]) * SEED_MIX + call) % (1 << 31)
            batch.append(list(prompts[i]) + tokens[i])
            sampling.append(p)
        outputs = generate(batch, sampling)
        still = []
        for i, asked, out in zip(running, sampling, outputs, strict=True):
            got = [int(t) for t in out["output_ids"]]
            tokens[i] += got
            log_probs[i] += [float(lp) for lp, *_ in out["meta_info"].get("output_token_logprobs") or []]
            versions[i] += [current] * len(got)
            stopped = len(got) < asked["max_new_tokens"] or (stops and got and got[-1] in stops)
            if not stopped and len(tokens[i]) < int(params[i]["max_new_tokens"]):
                still.append(i)
        running, call = still, call + 1
        if running and (new := swap()) is not None:
            current = int(new[0])
            load(new[1])
    return tokens, log_probs, versions
