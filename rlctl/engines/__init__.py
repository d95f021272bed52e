"""rlctl.engines: training and rollout engines behind one registry; they know nothing of RL.

- :mod:`.registry` — ``register_engine`` / ``get_engine`` keyed (kind, model_type, backend,
  device[, vendor]); out-of-tree engines via the ``rlctl.engines`` entry-point group.
- :mod:`.fsdp_train` — ``FSDPTrainEngine`` (FSDP2 ``fully_shard``; plain module without a process group).
- :mod:`.hf_rollout` — ``HFRolloutEngine`` (own KV-cache sampling loop over HF transformers).
- :mod:`.vllm_rollout`, :mod:`.sglang_rollout` — adapters, importing vLLM / SGLang lazily.
- :mod:`.logprob` — the one definition of token log-probs under a temperature, shared by both sides.

Importing this package stays cheap (no torch); the engine modules load on first lookup.
"""

from rlctl.engines.registry import get_engine, register_engine, registered

__all__ = ["get_engine", "register_engine", "registered"]
