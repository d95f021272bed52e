"""Addition, digit reversal and digit sorting: short prompts, short exact answers.

Formats (user message -> expected assistant answer, then EOS):
    addition   "12+34="     -> "46"   (style=question: "What is 12 + 34? Answer with only the number.")
    reverse    "rev 31452=" -> "25413"
    sort       "sort 31452=" -> "12345"
The answer must be exactly that text (surrounding whitespace ignored); anything else scores 0.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

from rlctl.data.tasks.base import ENUMERATE_LIMIT, Task, strip_answer

ADDITION_STYLES = {
    "equation": "{a}+{b}=",  # the built-in tiny model's compact format
    "question": "What is {a} + {b}? Answer with only the number.",  # for pretrained chat models
}


class AdditionTask(Task):
    """a+b with ``digits``-digit operands (default 2: 10..99), or 0..``max_operand`` when given;
    answer is the decimal sum. ``style`` picks the prompt text (:data:`ADDITION_STYLES`)."""

    name = "addition"
    val_fraction = 0.1

    def __init__(self, digits: int = 2, style: str = "equation", max_operand: int = 0) -> None:
        if not 1 <= int(digits) <= 18:
            raise ValueError(f"digits must be in 1..18, got {digits}")
        if style not in ADDITION_STYLES:
            raise ValueError(f"style must be one of {', '.join(ADDITION_STYLES)}, got {style!r}")
        if int(max_operand) < 0:
            raise ValueError(f"max_operand must be >= 0, got {max_operand}")
        self.digits = int(digits)
        self.style = style
        self.lo = 10 ** (self.digits - 1) if self.digits > 1 else 0
        self.hi = 10**self.digits - 1
        if max_operand:
            self.lo, self.hi = 0, int(max_operand)

    def sample(self, rng: random.Random) -> tuple[int, int]:
        return rng.randint(self.lo, self.hi), rng.randint(self.lo, self.hi)

    def enumerate(self) -> Iterator[tuple[int, int]] | None:
        if (self.hi - self.lo + 1) ** 2 > ENUMERATE_LIMIT:
            return None
        r = range(self.lo, self.hi + 1)
        return itertools.product(r, r)

    def key(self, problem: tuple[int, int]) -> str:
        return f"{problem[0]}+{problem[1]}"

    def row_parts(self, problem: tuple[int, int]) -> tuple[str, Any, str, dict[str, Any]]:
        a, b = problem
        answer = str(a + b)
        return ADDITION_STYLES[self.style].format(a=a, b=b), answer, answer, {"a": a, "b": b}

    def verify(self, solution_str: str, ground_truth: Any) -> float:
        return float(strip_answer(solution_str) == str(ground_truth).strip())


class _DigitsTask(Task):
    """Shared shape of reverse/sort: a digit string of ``length`` digits in, a digit string out."""

    prefix = ""

    def __init__(self, length: int = 5) -> None:
        if not 1 <= int(length) <= 64:
            raise ValueError(f"length must be in 1..64, got {length}")
        self.length = int(length)

    def sample(self, rng: random.Random) -> str:
        return "".join(rng.choice("0123456789") for _ in range(self.length))

    def enumerate(self) -> Iterator[str] | None:
        if 10**self.length > ENUMERATE_LIMIT:
            return None
        return (f"{i:0{self.length}d}" for i in range(10**self.length))

    def key(self, problem: str) -> str:
        return problem

    def transform(self, digits: str) -> str:
        raise NotImplementedError

    def row_parts(self, problem: str) -> tuple[str, Any, str, dict[str, Any]]:
        answer = self.transform(problem)
        return f"{self.prefix} {problem}=", answer, answer, {"digits": problem}

    def verify(self, solution_str: str, ground_truth: Any) -> float:
        return float(strip_answer(solution_str) == str(ground_truth).strip())


class ReverseTask(_DigitsTask):
    """Reverse a digit string."""

    name = "reverse"
    prefix = "rev"

    def transform(self, digits: str) -> str:
        return digits[::-1]


class SortTask(_DigitsTask):
    """Sort the digits of a digit string ascending."""

    name = "sort"
    prefix = "sort"

    def transform(self, digits: str) -> str:
        return "".join(sorted(digits))
