"""The bare model at a step's shapes, for ``rlctl bench step``: the profile's model as plain
transformers + torch (no engine, no dispatch, no reward, no weight sync) doing the step's model
work on this host, so every row's s/step can be read against it.

- ``update``: one forward of the step's rows with a gradient (``update_prompts`` groups of ``n``:
  the update skips groups whose advantages are all 0) in the packed layout the trainer uses
  (:mod:`rlctl.engines.packing`: each prompt once, every response a segment), log-softmax of the
  response tokens, backward, one fused AdamW step;
- ``gen``: a prefill of the distinct prompts, their KV cache repeated ``n`` times, then one decode
  pass of every row per token up to the longest response, multinomial sampling.

Every row is ``prompt_tokens`` prompt + ``response_tokens`` response tokens on average (the first
rlctl run's medians), the ids random: the time of a dense model does not depend on them; fp32, the
CPU platform's compute dtype. ``step_s`` = gen + update on the sync worker's threads;
``overlapped_step_s`` = the longer of the two, each on its side's share of the cores (the
off-policy modes run them at once). It is a reference, not a bound: the HF engine's decode drops
finished rows and its log-probs are chunked, so an engine can run below it on a large vocabulary;
where a row is well above it, the difference is the loop's own overhead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

MIN_REPEATS = 3
MAX_REPEATS = 20
BUDGET_S = 10.0  # per measured stage, after the warm-up call


def timed_best(fn: Callable[[], None]) -> float:
    """Best seconds of ``fn`` over MIN_REPEATS..MAX_REPEATS calls (as many as BUDGET_S allows)
    after one warm-up call: what the host can do, as the GEMM rate is its best."""
    fn()
    times: list[float] = []
    spent = 0.0
    while len(times) < MIN_REPEATS or (len(times) < MAX_REPEATS and spent < BUDGET_S):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        spent += times[-1]
    return min(times)


def step_rows(
    prompts: int, n: int, prompt_tokens: int, response_tokens: float, vocab: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """verl's layout of one step: ``n`` adjacent rows per prompt of ``prompt_tokens`` each, the
    responses right-padded, their lengths whole numbers that sum to ``response_tokens`` a row.
    Returns the distinct prompts, input ids, attention mask, positions and the response width."""
    rows = prompts * n
    total = max(rows, round(response_tokens * rows))
    lengths = torch.full((rows,), total // rows)
    lengths[: total % rows] += 1
    width = int(lengths.max())
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (prompts, prompt_tokens), generator=gen)
    response = torch.randint(0, vocab, (rows, width), generator=gen)
    response_mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    input_ids = torch.cat([prompt.repeat_interleave(n, 0), response * response_mask], dim=1)
    mask = torch.cat([torch.ones(rows, prompt_tokens, dtype=torch.long), response_mask], dim=1)
    return prompt, input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), width


def measure_bare_model(
    model_path: str | Path,
    *,
    prompts: int,
    n: int,
    prompt_tokens: int,
    response_tokens: float,
    threads: int,
    update_prompts: int | None = None,
    split_threads: tuple[int, int] | None = None,
    dtype: str = "float32",
) -> dict[str, Any]:
    """``gen_s``, ``update_s`` (best of a few calls) and their sum ``step_s`` on ``threads``
    threads (the sync worker's: it has the cores to itself); with ``split_threads`` = (rollout, train) threads, also
    each stage on its side's share of the cores and ``overlapped_step_s``, the longer of the two
    (the off-policy modes run generation and training at once). The update forwards the first
    ``update_prompts`` groups (all of them by default)."""
    from rlctl.engines.hf_model import load_causal_lm

    model = load_causal_lm(model_path, dtype=dtype)
    vocab = model.get_input_embeddings().weight.shape[0]
    prompt, input_ids, mask, positions, width = step_rows(
        prompts, n, max(1, prompt_tokens), max(1.0, response_tokens), vocab
    )
    generate = _generate(model, prompt, n, width)
    kept = n * min(prompts, update_prompts or prompts)
    update = _update(model, input_ids[:kept], mask[:kept], positions[:kept], width)
    gen_s = _on_threads(threads, generate)
    update_s = _on_threads(threads, update)
    out = {
        "gen_s": gen_s,
        "update_s": update_s,
        "step_s": gen_s + update_s,
        "threads": threads,
        "prompts": prompts,
        "n": n,
        "update_prompts": kept // n,
        "prompt_tokens": prompt.shape[1],
        "response_tokens": float(mask[:, prompt.shape[1] :].sum() / len(mask)),
    }
    if split_threads is not None:
        rollout, train = split_threads
        gen_split, update_split = _on_threads(rollout, generate), _on_threads(train, update)
        out.update(
            split_threads=list(split_threads),
            gen_split_s=gen_split,
            update_split_s=update_split,
            overlapped_step_s=max(gen_split, update_split),
        )
    return out


def _on_threads(threads: int, fn: Callable[[], None]) -> float:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return timed_best(fn)
    finally:
        torch.set_num_threads(before)


def _update(model, input_ids, mask, positions, width: int) -> Callable[[], None]:
    """One packed forward, the response tokens' log-probs, backward and a fused AdamW step."""
    from rlctl.engines.packing import pack_if_worth

    packed = pack_if_worth(input_ids, mask, positions, width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-9, fused=True)
    plen = input_ids.shape[1] - width

    def update() -> None:
        if packed is not None:
            logits = model(**packed.inputs()).logits[:, -packed.keep :]
            log_probs = torch.log_softmax(logits.float(), -1).gather(-1, packed.targets[..., None])
            loss = -packed.unpack(log_probs.squeeze(-1)).mean()
        else:
            logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions).logits
            log_probs = torch.log_softmax(logits[:, plen - 1 : -1].float(), -1)
            loss = -(log_probs.gather(-1, input_ids[:, plen:, None]).squeeze(-1) * mask[:, plen:]).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return update


def _generate(model, prompt: torch.Tensor, n: int, width: int) -> Callable[[], None]:
    """Prefill of the distinct prompts, the cache repeated ``n`` times, ``width`` sampled tokens
    (the longest row: a batch decodes until its last row ends)."""
    from transformers import DynamicCache

    from rlctl.engines.hf_model import cache_kwarg

    name = cache_kwarg(model)

    @torch.no_grad()
    def generate() -> None:
        cache = DynamicCache()
        out = model(input_ids=prompt, use_cache=True, **{name: cache})
        cache.batch_repeat_interleave(n)
        logits = out.logits[:, -1].repeat_interleave(n, 0)
        for t in range(width):
            token = torch.multinomial(torch.softmax(logits.float(), -1), 1)
            if t == width - 1:
                break
            position = torch.full((len(token), 1), prompt.shape[1] + t)
            out = model(input_ids=token, use_cache=True, position_ids=position, **{name: cache})
            logits = out.logits[:, -1]

    return generate


def bare_model_ratios(rows: list[dict[str, Any]], bare: dict[str, Any]) -> dict[str, float]:
    """Each row's s/step over the bare model's, the lower of its sync and overlapped step."""
    best = min(bare["step_s"], bare.get("overlapped_step_s", bare["step_s"]))
    return {f"{r['name']}_s_per_step_vs_bare_model": r["s_per_step"] / best for r in rows}


def bare_model_shape(row: dict[str, Any], sequences: int) -> tuple[int, float]:
    """(prompt, response) tokens per row of a run: its median response length, and the rest of its
    median real tokens per sequence (rounded: every prompt row has one length)."""
    response = row.get("response_tokens") or 1.0
    per_row = (row.get("tokens_per_step") or 0.0) / max(1, sequences)
    return max(1, round(per_row - response)), max(1.0, response)
