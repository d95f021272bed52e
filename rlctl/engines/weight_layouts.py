"""Which vLLM model classes hold the trainer's HF tensors in a layout the fingerprint can read.

The weight-sync check (:func:`rlctl.engines.vllm_worker.vllm_view`) reads an HF tensor out of a
vLLM parameter of the same name, a slice of a ``packed_modules_mapping`` stack, or the first rows
of a padded vocabulary. That is right only for model classes whose ``load_weights`` stores HF
tensors that way, so the view is looked up by the vLLM model class (its architecture). A class
that is not listed gives "not available" (``sync/fingerprint_ok = -1``), never a failed sync:

- verified packed layouts: ``Qwen2ForCausalLM`` (``vllm/model_executor/models/qwen2.py``),
  ``Qwen3ForCausalLM`` (``qwen3.py``), ``LlamaForCausalLM`` (``llama.py``), vllm 0.10.2 and 0.33.0;
- known to differ under the same name (a fingerprint would report a correct sync as wrong),
  listed in :data:`REORDERED` with the source line.
"""

from __future__ import annotations

PACKED = frozenset({"Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM"})

REORDERED = {
    "GPT2LMHeadModel": (
        "vLLM transposes GPT-2's Conv1D weights on load and keeps the name (square c_proj keeps the shape "
        "too): vllm 0.33.0 vllm/model_executor/models/gpt2.py _transpose_conv1d"
    ),
    "GPTNeoXForCausalLM": (
        "query_key_value is reordered from (heads, 3, head) to (3, heads, head) under the same name: "
        "vllm 0.10.2 vllm/model_executor/models/gpt_neox.py load_weights"
    ),
    "BloomForCausalLM": (
        "query_key_value is reordered from (heads, 3, head) to (3, heads, head) under the same name: "
        "vllm 0.33.0 vllm/model_executor/models/bloom.py _repack_qkv"
    ),
    "FalconForCausalLM": (
        "query_key_value is split per KV group and re-stacked as q, k, v under the same name: "
        "vllm 0.33.0 vllm/model_executor/models/falcon.py load_weights"
    ),
}


def fingerprint_unavailable(architecture: str) -> str | None:
    """Why the sync check cannot read this vLLM model class (None: it can)."""
    if architecture in PACKED:
        return None
    return REORDERED.get(architecture, f"{architecture}: weight layout not known to rlctl")
