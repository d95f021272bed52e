"""Guess the number with higher/lower feedback: the built-in multi-turn task the tiny model learns.

The environment (``builtin:guess``) holds a secret in ``0..hi``; each model turn is one guess, the
environment answers ``higher`` or ``lower`` (a user turn) until the guess is right (reward 1) or
the turns run out (reward 0). The feedback is needed: nothing in the prompt tells the secret::

    user       "guess 0-9"
    assistant  "5"          (then EOS)
    user       "lower"
    assistant  "2"          (then EOS)
    user       "higher"
    assistant  "3"          (then EOS)   -> reward 1

``extra_info.answer`` is a warm-up trace in the built-in tiny model's chat template from a
policy that knows the format but not the strategy: distinct guesses drawn uniformly, ignoring the
feedback (about 43% success in 3 turns over the problems; bisection reaches 88%). RL has to learn
to use the feedback. Problems are (hi, secret, variant); the variant only picks the trace.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Iterator
from typing import Any

from rlctl.data.tasks.base import Task, strip_answer

HIGHER, LOWER = "higher", "lower"


def feedback(guess: int, secret: int) -> str:
    return HIGHER if guess < secret else LOWER


def warmup_guesses(hi: int, secret: int, turns: int, seed: str) -> list[int]:
    """Distinct uniform guesses (ignoring feedback), stopping at the secret or after ``turns``."""
    rng = random.Random(hashlib.sha256(seed.encode()).hexdigest())
    guesses = rng.sample(range(hi + 1), min(turns, hi + 1))
    return guesses[: guesses.index(secret) + 1] if secret in guesses else guesses


def tiny_trace(guesses: list[int], secret: int) -> str:
    """The episode after the prompt in the built-in tiny template (the final EOS left out)."""
    parts = []
    for g in guesses[:-1]:
        parts.append(f"{g}<|eos|><|user|>{feedback(g, secret)}<|assistant|>")
    return "".join(parts) + str(guesses[-1])


# The prompt text by ``style``: the tiny model's terse game, or a question a pretrained chat model
# reads as asking for a number alone (``builtin:guess?style=question``; same problems and answers).
GUESS_STYLES = {
    "game": "guess 0-{hi}",
    "question": "Pick a number between 0 and {hi}. Reply with just the digit.",
}


class GuessTask(Task):
    """Secret in ``0..hi`` with ``hi`` in ``min_hi..9``; ``turns`` is the warm-up trace's limit;
    ``style`` picks the prompt text (:data:`GUESS_STYLES`)."""

    name = "guess"
    val_fraction = 0.1
    default_sizes = {"train": 4000, "validation": 200}

    def __init__(self, min_hi: int = 3, turns: int = 3, variants: int = 100, style: str = "game") -> None:
        if not 1 <= int(min_hi) <= 9 or int(turns) < 1 or int(variants) < 1:
            raise ValueError(
                f"need 1 <= min_hi <= 9, turns >= 1, variants >= 1; got {min_hi}, {turns}, {variants}"
            )
        if style not in GUESS_STYLES:
            raise ValueError(f"style must be one of {', '.join(GUESS_STYLES)}, got {style!r}")
        self.min_hi, self.turns, self.variants = int(min_hi), int(turns), int(variants)
        self.style = style

    def enumerate(self) -> Iterator[tuple[int, int, int]]:
        return (
            (hi, s, v)
            for hi, v in itertools.product(range(self.min_hi, 10), range(self.variants))
            for s in range(hi + 1)
        )

    def key(self, problem: tuple[int, int, int]) -> str:
        return "{}:{}:{}".format(*problem)

    def row_parts(self, problem: tuple[int, int, int]) -> tuple[str, Any, str, dict[str, Any]]:
        hi, secret, variant = problem
        guesses = warmup_guesses(hi, secret, self.turns, self.key(problem))
        prompt = GUESS_STYLES[self.style].format(hi=hi)
        return prompt, str(secret), tiny_trace(guesses, secret), {"hi": hi, "agent_name": "guess"}

    def verify(self, solution_str: str, ground_truth: Any) -> float:
        """Single-turn view: the last guess in the text is the secret."""
        last = strip_answer(solution_str).split()[-1:] or [""]
        return float(last[0] == str(ground_truth).strip())
