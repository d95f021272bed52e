"""What a built-in task is, and how its deterministic, disjoint train/validation splits are drawn.

A problem belongs to validation iff a hash of (task, seed, problem key) falls under
``val_fraction``; membership is a pure function of the problem, so the two splits are disjoint
by construction, whatever sizes are asked for. Within a split, problems are drawn with a
``random.Random`` seeded by (task, seed, split), so a split is the same list on every machine.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from typing import Any

SPLITS = ("train", "validation")
ENUMERATE_LIMIT = 200_000  # problem spaces up to this size are listed and shuffled, not sampled


class Task:
    """A verifiable task: draws problems, turns them into verl-schema rows, scores answers.

    Subclasses set ``name``, implement ``sample``, ``key``, ``row_parts`` and ``verify``, and may
    implement ``enumerate`` when the problem space is small enough to list.
    """

    name: str = ""
    default_sizes: dict[str, int] = {"train": 10_000, "validation": 400}
    val_fraction: float = 0.1

    @property
    def data_source(self) -> str:
        return f"rlctl/{self.name}"

    def sample(self, rng: random.Random) -> Any:
        raise NotImplementedError

    def enumerate(self) -> Iterator[Any] | None:
        """All problems, in a fixed order, when there are at most ENUMERATE_LIMIT; else None."""
        return None

    def key(self, problem: Any) -> str:
        raise NotImplementedError

    def row_parts(self, problem: Any) -> tuple[str, Any, str, dict[str, Any]]:
        """(user message, ground truth, reference answer text, extra fields for extra_info)."""
        raise NotImplementedError

    def verify(self, solution_str: str, ground_truth: Any) -> float:
        """1.0 for a correct answer in the task's exact format, else 0.0; never raises on bad text."""
        raise NotImplementedError

    # -- splits ---------------------------------------------------------------------------
    def in_validation(self, problem: Any, seed: int) -> bool:
        digest = hashlib.sha256(f"{self.name}|{seed}|{self.key(problem)}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2.0**64 < self.val_fraction

    def problems(self, split: str, n: int, seed: int) -> list[Any]:
        """``n`` distinct problems of ``split`` (fewer if the split holds fewer), deterministic."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        want_val = split == "validation"
        rng = random.Random(f"{self.name}|{seed}|{split}")
        listed = self.enumerate()
        if listed is not None:
            pool = [p for p in listed if self.in_validation(p, seed) == want_val]
            rng.shuffle(pool)
            return pool[:n]
        seen: set[str] = set()
        out: list[Any] = []
        for _ in range(50 * n + 1000):
            if len(out) >= n:
                break
            p = self.sample(rng)
            k = self.key(p)
            if k in seen or self.in_validation(p, seed) != want_val:
                continue
            seen.add(k)
            out.append(p)
        return out

    def rows(self, split: str, n: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        """The split as rows in verl's schema (prompt, data_source, reward_model, extra_info)."""
        n = self.default_sizes[split] if n is None else n
        rows = []
        for i, p in enumerate(self.problems(split, n, seed)):
            content, truth, answer, extra = self.row_parts(p)
            rows.append(
                {
                    "prompt": [{"role": "user", "content": content}],
                    "data_source": self.data_source,
                    "reward_model": {"ground_truth": truth, "style": "rule"},
                    "extra_info": {"split": split, "index": i, "answer": answer, **extra},
                }
            )
        return rows


def strip_answer(solution_str: str) -> str:
    """The answer text a verifier compares: cut at an end marker if one leaked in, trim spaces."""
    for marker in ("<|eos|>", "<|endoftext|>", "<|im_end|>"):
        solution_str = solution_str.split(marker, 1)[0]
    return solution_str.strip()
