"""What every tracking backend implements, and the value coercion they share."""

from __future__ import annotations

import math
from typing import Any, Protocol


class Backend(Protocol):
    """A sink for per-step metrics; ``log`` may be called more than once per step."""

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def to_number(key: str, value: Any) -> float | int | None:
    """A JSON-safe number for one metric: ints stay ints, None and non-finite floats become None.

    Accepts Python numbers, numpy scalars and one-element tensors (anything ``float()`` takes);
    None means "no value this step" and stays None.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"metric {key!r}: expected a number, got {type(value).__name__} {value!r}") from exc
    return number if math.isfinite(number) else None
