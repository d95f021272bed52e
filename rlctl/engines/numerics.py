"""How far a forward in a low-precision dtype may drift from the exact one: the parity tolerances.

One rule serves ``rlctl bench parity`` (each quantity against a CPU float64 reference) and the
canary after every weight sync (rollout engine against trainer on a fixed token sequence).

Why this rule. A per-token log-prob is ``log_softmax`` of logits that come out of ``layers``
residual blocks. Two kinds of rounding enter, with unit roundoff ``u`` (half the machine epsilon:
2**-24 for float32, 2**-11 for float16, 2**-8 for bfloat16):

- accumulation: every block sums dot products of length ``hidden`` (projections, MLP) and
  attention over up to ``seq_len`` positions. The kernels accumulate in float32 (CPU autocast,
  tensor cores), and ``n`` accumulated terms err like ``sqrt(n) * u`` (the probabilistic bound of
  Higham & Mary, "A new approach to probabilistic rounding error analysis", SISC 2019), so this
  term is ``u(float32) * sqrt(layers * (hidden + seq_len))``;
- storage: in a low-precision dtype each block rounds its activations (q, k, v, attention output,
  o_proj, gate, up, their product, down, the norms: ``ROUNDINGS_PER_LAYER``) to the dtype once
  each, ``u(dtype) * sqrt(layers * ROUNDINGS_PER_LAYER)``.

Errors of stacked layers add in quadrature, so the typical (mean absolute) log-prob error in nats is

    scale = u(dtype) * sqrt(layers * ROUNDINGS_PER_LAYER) + u(float32) * sqrt(layers * (hidden + seq_len))

and a healthy device stays within ``PASS_FACTOR`` of it. Measured on a 2-core x86 CPU (README:
"Numerical parity"), the mean log-prob and entropy errors of the built-in 1M model and
SmolLM2-135M sit at 0.5-2.4x the scale in float32 and 0.4-0.8x in bfloat16. ``PASS_FACTOR`` 4 leaves that margin; up to ``WARN_FACTOR`` times more is a WARN
(worth a look); beyond it the device or engine computes something else (a wrong kernel, weights it
does not hold): FAIL.

Means, not maxima, decide: single rare tokens differ by nats on healthy bfloat16 runs (their
log-prob is a small difference of large logits), while a broken kernel moves every token. The
gap between two low-precision computations (train vs rollout) may be the sum of both errors:
twice the tolerance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

PASS_FACTOR = 4.0
ROUNDINGS_PER_LAYER = 10
WARN_FACTOR = 4.0  # WARN up to PASS_FACTOR * WARN_FACTOR * scale, FAIL beyond
VERDICTS = ("PASS", "WARN", "FAIL")


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the machine epsilon: the largest relative error of one rounding to ``dtype``."""
    return torch.finfo(dtype).eps / 2


@dataclass(frozen=True)
class Tolerance:
    """``value <= passes``: PASS; ``<= warns``: WARN; beyond: FAIL. ``why`` says where it comes from."""

    passes: float
    warns: float
    why: str

    def verdict(self, value: float) -> str:
        if not value <= self.warns:  # NaN fails
            return "FAIL"
        return "PASS" if value <= self.passes else "WARN"

    def scaled(self, factor: float, why: str) -> Tolerance:
        return Tolerance(self.passes * factor, self.warns * factor, why)

    def to_dict(self) -> dict:
        return asdict(self)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def error_scale(dtype: torch.dtype, *, layers: int, hidden: int, seq_len: int) -> float:
    """The typical log-prob error in nats (module docstring): storage rounding + accumulation."""
    storage = unit_roundoff(dtype) * (layers * ROUNDINGS_PER_LAYER) ** 0.5
    return storage + unit_roundoff(torch.float32) * (layers * (hidden + seq_len)) ** 0.5


def log_prob_tolerance(dtype: torch.dtype, *, layers: int, hidden: int, seq_len: int) -> Tolerance:
    """Tolerance on the mean absolute per-token log-prob error against an exact reference."""
    scale = error_scale(dtype, layers=layers, hidden=hidden, seq_len=seq_len)
    why = (
        f"mean |error| <= {PASS_FACTOR:g} x (u({_name(dtype)}) x sqrt({layers} layers x "
        f"{ROUNDINGS_PER_LAYER} roundings) + u(float32) x sqrt({layers} layers x ({hidden} hidden + "
        f"{seq_len} positions))) = {PASS_FACTOR * scale:.3g}"
    )
    return Tolerance(PASS_FACTOR * scale, PASS_FACTOR * WARN_FACTOR * scale, why)


def grad_tolerance(dtype: torch.dtype, *, layers: int, hidden: int, seq_len: int, tokens: int) -> Tolerance:
    """Tolerance on relative errors of gradients (per-layer norms, the optimiser step they drive).

    The backward pass rounds as many activations again (``2 * ROUNDINGS_PER_LAYER``) and runs the
    forward's matmuls transposed (another ``hidden``), and each weight gradient sums over every
    token of the batch (``tokens`` more terms). An AdamW step moves each element by about
    ``lr * sign(grad)``: an element flips where its gradient is within its rounding error of zero,
    so the step's relative error follows the gradients' (same tolerance).
    """
    storage = unit_roundoff(dtype) * (layers * 2 * ROUNDINGS_PER_LAYER) ** 0.5
    accumulation = unit_roundoff(torch.float32) * (layers * (2 * hidden + seq_len + tokens)) ** 0.5
    scale = storage + accumulation
    why = (
        f"relative, <= {PASS_FACTOR:g} x (u({_name(dtype)}) x sqrt({layers} layers x "
        f"{2 * ROUNDINGS_PER_LAYER} roundings) + u(float32) x sqrt({layers} layers x (2 x {hidden} hidden + "
        f"{seq_len} positions + {tokens} tokens))) = {PASS_FACTOR * scale:.3g}"
    )
    return Tolerance(PASS_FACTOR * scale, PASS_FACTOR * WARN_FACTOR * scale, why)


def gap_tolerance(dtypes: tuple[torch.dtype, ...], *, layers: int, hidden: int, seq_len: int) -> Tolerance:
    """Tolerance on the mean absolute gap between two computations, each in one of ``dtypes``:
    twice the coarser dtype's log-prob tolerance (each side may carry its own error)."""
    coarse = max(dtypes, key=unit_roundoff)
    one = log_prob_tolerance(coarse, layers=layers, hidden=hidden, seq_len=seq_len)
    return one.scaled(2.0, f"2 x ({one.why}): both sides carry rounding error")


def worst(verdicts) -> str:
    """The worst of PASS / WARN / FAIL (PASS for none)."""
    return max(verdicts, key=VERDICTS.index, default="PASS")


def _text_config(config):
    """The text model's config (multimodal configs hold one); the config itself otherwise."""
    return getattr(config, "get_text_config", lambda: config)()


def model_shape(config) -> tuple[int, int]:
    """``(layers, hidden)`` of an HF config (text config of multimodal ones)."""
    text = _text_config(config)
    return int(text.num_hidden_layers), int(text.hidden_size)


def vocab_size_of(config) -> int:
    """The vocabulary size of an HF config (text config of multimodal ones)."""
    return int(_text_config(config).vocab_size)
