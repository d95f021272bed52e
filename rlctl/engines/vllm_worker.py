"""The worker extension rlctl mixes into each vLLM worker (``worker_extension_cls``), reached via
``collective_rpc``: weights loaded by HF name, and the fingerprint read from vLLM's own parameters."""

from __future__ import annotations

import torch

from rlctl.engines.fingerprint import fingerprint_views
from rlctl.engines.lora import base_name
from rlctl.engines.weight_layouts import fingerprint_unavailable


class RlctlWorkerExtension:
    """Mixed into each vLLM worker (``worker_extension_cls``); reached via ``collective_rpc``."""

    def rlctl_model(self):
        """``model_runner.get_model()``: unwraps vLLM 0.13's ``CUDAGraphWrapper``, whose name hid the
        layout from the fingerprint (``v1/worker/gpu_model_runner.py``; 0.33 V2 ``gpu/model_runner.py``)."""
        return getattr(self.model_runner, "get_model", lambda: self.model_runner.model)()

    def rlctl_load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> int:
        """Load HF-named tensors into the worker's model in place; returns how many were given."""
        self.rlctl_model().load_weights(weights=weights)
        return len(weights)

    def rlctl_weight_fingerprint(
        self, spec: list[tuple[str, tuple[int, ...]]], salt: int = 0
    ) -> dict[str, tuple[float, float, str] | None]:
        """Fingerprints at ``salt``'s positions of HF-named tensors read from the worker's model
        (:func:`vllm_view`); all None for a model class whose layout is unknown (``weight_layouts``)."""
        model = self.rlctl_model()
        if fingerprint_unavailable(type(model).__name__) is not None:
            return {name: None for name, _ in spec}
        params = dict(model.named_parameters(remove_duplicate=False))
        # a LoRA actor's names (``base_layer``, ``modules_to_save``) read the base's tensor; the
        # fingerprint itself is keyed by the name given, as the trainer's side is
        return fingerprint_views(spec, lambda n, shape: vllm_view(model, params, base_name(n), shape), salt)


def vllm_view(model, params: dict[str, torch.Tensor], name: str, shape: tuple[int, ...]):
    """The part of a vLLM parameter that holds HF tensor ``name`` (rollout TP 1), or None.

    vLLM merges q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj``, named in the model
    class's ``packed_modules_mapping`` (``vllm/model_executor/models/qwen2.py``, ``llama.py``, 0.10.2
    and 0.33.0), stacked along the output dim (dim 0) in the sizes of the merged layer's
    ``output_sizes`` (``vllm/model_executor/layers/linear.py``: ``MergedColumnParallelLinear``,
    ``QKVParallelLinear``), and pads the vocab rows of ``VocabParallelEmbedding`` / ``ParallelLMHead``
    to a multiple of 64 (``vocab_parallel_embedding.py``). Layouts beyond these (renamed prefixes,
    quantised or repacked weights) give None: the check then reports "not available", never "ok".
    """
    param = params.get(name)
    if param is None:
        module_path, _, leaf = name.rpartition(".")
        prefix, _, sub = module_path.rpartition(".")
        for fused, parts in (getattr(model, "packed_modules_mapping", None) or {}).items():
            if sub not in parts:
                continue
            fused_path = f"{prefix}.{fused}" if prefix else fused
            merged = params.get(f"{fused_path}.{leaf}")
            try:
                sizes = list(model.get_submodule(fused_path).output_sizes)
            except (AttributeError, TypeError):
                return None
            if merged is None or len(sizes) != len(parts) or sum(sizes) != merged.shape[0]:
                return None
            i = parts.index(sub)
            return merged.narrow(0, sum(sizes[:i]), sizes[i])
        return None
    if param.dim() == len(shape) and param.shape[1:] == shape[1:] and param.shape[0] > shape[0]:
        return param.narrow(0, 0, shape[0])  # padded vocab rows
    return param
