"""transformers' Hub kernels, kept off: the platform picks the kernels, and a run reaches no hub."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def no_hub_kernels() -> dict[str, bool]:
    """``from_pretrained``'s ``use_kernels=False`` where transformers takes it (from 4.53; {} before).

    From 5.x transformers turns it on by default whenever the ``kernels`` package is installed
    (``USE_HUB_KERNELS`` unset): ``from_pretrained`` then fetches layer kernels from the
    Hub at load time and swaps them in, and every ``train()``/``eval()`` re-kernelizes the model
    (transformers/modeling_utils.py: ``from_pretrained`` -> ``set_use_kernels``, ``train`` ->
    ``kernels_mode``). The platform picks rlctl's kernels, and a run reaches no hub, so off.
    """
    import transformers
    from packaging.version import Version

    return {"use_kernels": False} if Version(transformers.__version__) >= Version("4.53") else {}
