"""In-flight weight updates: a rollout engine swapping to newer weights between decode steps,
without dropping the sequences it is generating (partial rollouts, as PipelineRL and NeMo-RL's
in-flight updates do).

A swap is asked for between decode steps by a callable the caller hands to ``generate``:
``swap() -> None`` (keep going) or ``(version, stream)`` (load the ``(name, tensor)`` stream in
place, then go on under weight ``version``). Each response token then carries the version it was
sampled with (``token_versions``), so the trainer can bound staleness per token and the decoupled
PPO correction uses each token's own behaviour log-prob.

What happens to the KV cache of the tokens already generated (``kv_on_swap``):

- ``recompute`` (rlctl's default): one forward of every running row's tokens so far under the new
  weights rebuilds the cache, so every token after the swap is sampled from, and scored with, the
  new weights' exact distribution: its behaviour log-prob is the new policy's score of it.
- ``keep`` (PipelineRL's): the old cache stays; tokens after the swap attend to keys and values
  computed by the old weights. No extra forward, but their log-probs are those of neither policy;
  the gap to the new weights' scores is measured in docs/async-rollouts.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

KV_ON_SWAP = ("recompute", "keep")

Swap = Callable[[], "tuple[int, Iterable[tuple[str, torch.Tensor]]] | None"]
