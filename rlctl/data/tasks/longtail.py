"""``longtail``: echo a digit string whose length is long-tailed, so response lengths are too.

Format (user message -> expected assistant answer, then EOS)::

    "echo 31452=" -> "31452"

The digit string's length is drawn log-uniformly from ``min_len..max_len`` (default 2..100); the
splits hold distinct problems, so the shortest lengths (100 strings of 2 digits) run out early. Of
10,000 training rows (seed 0): median 17 digits, mean 27, 18% at most 5, 19% longer than 50, 1%
longer than 98. A batch's generation then runs as long as its longest answer while most rows
finished long before: the shape of real RL generation (the tail decodes a few rows while the rest
wait), which the fixed-length built-in tasks lack. With the character tokenizer of the built-in
tiny models, an answer of ``L`` digits is ``L`` tokens plus EOS.

The answer must be exactly the digit string (surrounding whitespace ignored); anything else scores 0.
"""

from __future__ import annotations

import math
import random
from typing import Any

from rlctl.data.tasks.base import Task, strip_answer


class LongTailTask(Task):
    """Echo ``L`` digits, ``L`` log-uniform in ``min_len..max_len``."""

    name = "longtail"
    val_fraction = 0.1

    def __init__(self, min_len: int = 2, max_len: int = 100) -> None:
        if not 1 <= int(min_len) <= int(max_len) <= 400:
            raise ValueError(f"need 1 <= min_len <= max_len <= 400, got {min_len}, {max_len}")
        self.min_len, self.max_len = int(min_len), int(max_len)

    def length(self, rng: random.Random) -> int:
        """A log-uniform length in ``min_len..max_len`` (each length's share falls as 1/L)."""
        lo, hi = math.log(self.min_len), math.log(self.max_len + 1)
        return min(self.max_len, int(math.exp(rng.uniform(lo, hi))))

    def sample(self, rng: random.Random) -> str:
        n = self.length(rng)
        return "".join(rng.choice("0123456789") for _ in range(n))

    def key(self, problem: str) -> str:
        return problem

    def row_parts(self, problem: str) -> tuple[str, Any, str, dict[str, Any]]:
        return f"echo {problem}=", problem, problem, {"digits": problem, "length": len(problem)}

    def verify(self, solution_str: str, ground_truth: Any) -> float:
        return float(strip_answer(solution_str) == str(ground_truth).strip())
