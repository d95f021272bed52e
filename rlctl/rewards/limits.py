"""What a reward parse may cost, and the exception that says a sample went past it.

A response can be written to make a parser slow or hungry (a power tower for sympy, a deeply
nested expression, a reply that fills memory). Such a sample scores 0 and is counted in
``reward/over_limit``; it is the response's doing, not a scorer bug, so it never counts against
``reward.max_error_rate`` and the step goes on.
"""

from __future__ import annotations

# Data segment (heap) of one math/verl scorer process: it holds math-verify and sympy (~270 MB)
# and one sample's parse; a response whose parse needs more fails with MemoryError instead of
# taking the host's memory.
SCORER_DATA_LIMIT_MB = 2048


class OverLimit(Exception):  # noqa: N818 - reads as what happened to the sample
    """A sample whose scoring would cost more than the limits allow: it scores 0 and is counted."""


# what a scorer raises when a sample went past a bound (time is bounded by the pool's kill)
LIMIT_ERRORS = (OverLimit, MemoryError, RecursionError)
