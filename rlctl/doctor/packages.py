"""Which distributions doctor reports: its own list of the RL stack, with each vendor's packages
read from the platforms (``tool_dists``, ``stack_dists``, ``overrides``).

The vendors are every built-in platform, in :data:`~rlctl.platforms.BUILTINS` order, then the
chosen platform when it is an out-of-tree plugin: a vendor's packages appear by declaring them in
its platform file. Row order: the required packages, the vendors' device libraries, the engines
and kernels, the vendors' torch and engine extensions, the other optional packages.
"""

from __future__ import annotations

from rlctl.platforms import BUILTINS, Platform
from rlctl.platforms.resolve import builtin_type

REQUIRED = ("torch", "transformers", "ray", "safetensors", "tokenizers")
ENGINES = ("vllm", "sglang", "flash-attn", "flashinfer-python")
OPTIONAL = ("accelerate", "peft")
# distribution -> module that `doctor --deep` imports
IMPORTS = {
    "torch": "torch",
    "transformers": "transformers",
    "vllm": "vllm",
    "sglang": "sglang",
    "flash-attn": "flash_attn",
}
# whose requirements the consistency check verifies (when installed): these, the vendors'
# extensions, then flash-attn
STACK = ("rlctl", "torch", "transformers", "ray", "vllm", "sglang")
STACK_LAST = ("flash-attn",)


def vendors(p: Platform) -> list[type[Platform]]:
    """Every built-in platform, then ``p``'s own class when it is not one of them."""
    types = [builtin_type(name) for name in BUILTINS]
    return types if type(p) in types else [*types, type(p)]


def packages(p: Platform) -> dict[str, bool]:
    """distribution -> required on every platform? (one ``package:`` row each, in this order)"""
    vs = vendors(p)
    optional = [*(d for v in vs for d in v.tool_dists), *ENGINES]
    optional += [*(d for v in vs for d in v.stack_dists), *OPTIONAL]
    out = dict.fromkeys(REQUIRED, True)
    for name in optional:
        out.setdefault(name, False)
    return out


def imports(p: Platform) -> dict[str, str]:
    """distribution -> module that ``doctor --deep`` imports when the distribution is installed."""
    out = dict(IMPORTS)
    for v in vendors(p):
        out.update(v.stack_dists)
    return out


def stack(p: Platform) -> tuple[str, ...]:
    """The distributions whose own requirements doctor checks (``deps:`` rows), in this order."""
    return tuple(dict.fromkeys([*STACK, *(d for v in vendors(p) for d in v.stack_dists), *STACK_LAST]))


def overrides(p: Platform) -> dict[str, str]:
    """base distribution -> the vendor extension whose pins replace the base's (see ``Platform.overrides``)."""
    out: dict[str, str] = {}
    for v in vendors(p):
        out.update(v.overrides)
    return out
