"""Partial rollouts on a rollout worker: the engine's swap hook, fed by the driver's newest weights.

The HF engine asks ``swap()`` between decode steps (:mod:`rlctl.engines.inflight`). A rollout
worker hands it a :class:`SwapHook` over a :class:`WeightBoard`, the driver's view of the newest
published version (the async pipeline's source): when a newer version than the engine holds has
been published, the hook returns it, and the running rows go on under it (their KV cache
rebuilt). Versions only ever move forward, so every token is at least as new as the version the
generation started with, which the pipeline's gate already held to the staleness bound.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch

from rlctl.trainer.workers.weight_streams import PublishedWeights


class WeightBoard(Protocol):
    """The driver's newest published weights, asked from the rollout worker's generation."""

    def newer(self, than: int) -> tuple[int, PublishedWeights] | None:
        """The newest published version and its weights if newer than ``than``, else None."""


class SwapHook:
    """The ``swap`` callable of one generation: the board's newest weights, when newer."""

    def __init__(self, board: WeightBoard, version: int) -> None:
        self.board, self.version = board, version
        self.last: PublishedWeights | None = None  # the last weights swapped in (checked afterwards)
        self.swaps = 0

    def __call__(self) -> tuple[int, Iterable[tuple[str, torch.Tensor]]] | None:
        got = self.board.newer(self.version)
        if got is None:
            return None
        self.version, self.last = got
        self.swaps += 1
        return self.version, list(self.last.weights.items())
