"""What a weight sync sends: a byte count of any stream, and a LoRA actor's two streams.

A rollout engine whose ``adapter_sync`` is true gets only the adapter tensors (the HF engine
copies them in place; vLLM and SGLang load them through their LoRA APIs). Any other engine gets the
base with the adapter merged in (``W + B @ A * alpha / r`` under the base's HF names), the full
model's bytes, one parameter gathered at a time; :func:`merged_stream` keeps 64 sampled elements of
every merged tensor, so the sync check can compare each of them with what the engine then holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from rlctl.engines.fingerprint import Sampled, sample
from rlctl.engines.lora import ADAPTER, LoraSpec, base_name, is_adapter, scaling
from rlctl.engines.weight_delta import TensorDelta


@dataclass
class PublishedWeights:
    """What the trainer publishes to the off-policy modes' rollout workers: the weights (HF names,
    host copies; a LoRA actor's adapter or merged model, as its sync would send) and the trainer's
    canary scores for them (:mod:`rlctl.trainer.state.canary`), which the rollout worker compares
    with its own engine's after loading them."""

    weights: dict[str, torch.Tensor]
    canary_tokens: list[int] | None = None
    canary_scores: torch.Tensor | None = None  # the trainer's log-probs of canary_tokens[1:]
    model_shape: tuple[int, int] | None = None  # (layers, hidden): the canary's tolerance
    canary_vocab: int = 0  # the vocabulary the canary tokens come from (its logit-spread scaling)
    canary_s: float = 0.0  # the trainer side's seconds
    # delta pushes (rollout.delta_sync, :mod:`.delta_push`): ``weights`` empty, ``deltas`` from
    # ``base_version`` (None: a full push), ``samples`` the fingerprint's of the new tensors
    deltas: list[TensorDelta] | None = None
    base_version: int | None = None
    samples: list[tuple[str, Sampled]] | None = None
    version: int | None = None  # the weight version these are (set by delta publications)


class ByteCount:
    """Wraps a stream of ``(name, tensor)`` or of buckets of them; ``bytes`` counts what passed."""

    def __init__(self) -> None:
        self.bytes = 0

    def __call__(self, stream: Iterable) -> Iterator:
        for item in stream:
            for _, tensor in item if isinstance(item, list) else [item]:
                self.bytes += tensor.numel() * tensor.element_size()
            yield item


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of the full model's weights as a full sync sends them (tied weights once, no adapter)."""
    return sum(
        p.numel() * p.element_size()
        for n, p in model.named_parameters()
        if not is_adapter(n) and f".modules_to_save.{ADAPTER}." not in n
    )


def merged_stream(
    actor: Any, spec: LoraSpec, checked: dict[str, Sampled], salt: int = 0
) -> Iterator[tuple[str, torch.Tensor]]:
    """The actor's weights under the base's HF names with the adapter merged in (every rank
    gathers every tensor, as ``export_weights("full")`` does). Every tensor sent also leaves its
    fingerprint samples for ``salt`` in ``checked`` (:func:`rlctl.engines.fingerprint.sample`:
    64 elements each, nothing else kept), so the sync check covers every tensor of the stream."""
    adapter = dict(actor.export_adapter())
    s = scaling(spec)
    for name, tensor in actor.export_weights("full"):
        if is_adapter(name) or ".original_module." in name:
            continue
        if name.endswith(".base_layer.weight"):
            module = name.removesuffix(".base_layer.weight")
            a, b = adapter[f"{module}.lora_A.{ADAPTER}.weight"], adapter[f"{module}.lora_B.{ADAPTER}.weight"]
            tensor = (tensor + (b @ a) * s).to(tensor.dtype)
        checked[base_name(name)] = sample(base_name(name), tensor, salt)
        yield base_name(name), tensor
