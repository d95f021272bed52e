"""Turn per-sequence token lists from an external engine (vLLM, SGLang) into the batch convention."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from rlctl.engines.logprob import position_ids_from_mask


def stop_token_ids(eos_token_id: int | Sequence[int] | None) -> list[int]:
    """EOS given as an int, a list or None (never stop) -> the engines' stop-token list."""
    return [] if eos_token_id is None else [int(t) for t in torch.tensor(eos_token_id).view(-1)]


def row_seeds(seed: int | None, rows: int) -> list[int | None]:
    """One seed per row, derived from ``(seed, row)``: a group's copies differ, a rerun repeats them.

    vLLM seeds each request's generator with its ``SamplingParams.seed`` and SGLang uses
    ``sampling_seed`` as given, so one seed for every row would make the n copies of a prompt
    identical. Seeds fit in 31 bits (every engine version accepts them). ``seed=None``: unseeded.
    """
    if seed is None:
        return [None] * rows
    out = []
    for row in range(rows):
        digest = hashlib.blake2b(f"{int(seed)}:{row}".encode(), digest_size=8).digest()
        out.append(int.from_bytes(digest, "little") & 0x7FFFFFFF)
    return out


def unpadded_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int) -> list[list[int]]:
    """Each left-padded prompt as a plain token list, repeated ``n`` times (samples adjacent)."""
    prompts = [row[m.bool()].tolist() for row, m in zip(prompt_ids, prompt_mask, strict=True)]
    return [p for p in prompts for _ in range(n)]


def assemble_rollout(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    responses: Sequence[Sequence[int]],
    log_probs: Sequence[Sequence[float]] | None,
    *,
    n: int,
    max_new_tokens: int,
    pad_token_id: int,
) -> dict[str, torch.Tensor]:
    """Right-pad responses to ``max_new_tokens`` and build masks/positions like the HF engine does.

    ``log_probs=None`` (the engine's values are not rlctl's convention): no ``rollout_log_probs`` key.
    """
    rows = prompt_ids.shape[0] * n
    if len(responses) != rows or (log_probs is not None and len(log_probs) != rows):
        raise ValueError(f"expected {rows} responses (prompts x n), got {len(responses)}")
    resp = torch.full((rows, max_new_tokens), pad_token_id, dtype=prompt_ids.dtype)
    logp = torch.zeros(rows, max_new_tokens, dtype=torch.float32)
    rmask = torch.zeros(rows, max_new_tokens, dtype=torch.long)
    for i, tokens in enumerate(responses):
        tokens = list(tokens)[:max_new_tokens]
        length = len(tokens)
        if length:
            resp[i, :length] = torch.tensor(tokens, dtype=prompt_ids.dtype)
            if log_probs is not None:
                logp[i, :length] = torch.tensor(list(log_probs[i])[:length], dtype=torch.float32)
            rmask[i, :length] = 1
    prompts = prompt_ids.cpu().repeat_interleave(n, dim=0)
    mask = torch.cat([prompt_mask.cpu().long().repeat_interleave(n, dim=0), rmask], dim=1)
    out = {
        "prompts": prompts,
        "responses": resp,
        "input_ids": torch.cat([prompts, resp], dim=1),
        "attention_mask": mask,
        "position_ids": position_ids_from_mask(mask),
        "response_mask": rmask,
    }
    if log_probs is not None:
        out["rollout_log_probs"] = logp
    return out


def bucketed(stream, bucket_bytes: int):
    """Group ``(name, tensor)`` pairs into lists of about ``bucket_bytes`` (one call per bucket)."""
    bucket, size = [], 0
    for name, tensor in stream:
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


def padded_versions(versions: Sequence[Sequence[int]], max_new_tokens: int) -> torch.Tensor:
    """Per-token weight versions right-padded with 0 to ``max_new_tokens`` (the HF engine's
    ``token_versions``: 0 past the response)."""
    out = torch.zeros(len(versions), max_new_tokens, dtype=torch.long)
    for i, row in enumerate(versions):
        row = list(row)[:max_new_tokens]
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out
