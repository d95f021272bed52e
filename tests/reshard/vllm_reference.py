"""Independent reference of what vLLM's TP rank loads from full HF tensors (Llama/Qwen2).

It lives in :mod:`rlctl.reshard.verify` (written from vLLM's weight loaders, not from rlctl's
layouts), where ``rlctl bench reshard`` checks every strategy against it; tests import it from here.
"""

from rlctl.reshard.verify import vllm_shard

__all__ = ["vllm_shard"]
