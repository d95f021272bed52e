"""Prompt datasets: built-in tasks or verl-schema files, with chat templating and length filtering.

Spec strings (what a profile names)::

    builtin:addition                  the built-in task, default options
    builtin:addition?digits=3&n=2000  task options, plus n = number of rows of the split
    data/train.jsonl                  a file (JSONL or Parquet); the file is the split
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from rlctl.data.files import read_rows
from rlctl.data.tasks import SPLITS, get_task
from rlctl.errors import UserError
from rlctl.log import get_logger

BUILTIN_PREFIX = "builtin:"


def render_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The chat template applied to ``messages`` with the generation prompt appended."""
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def encode_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of the templated prompt (the template already holds any special tokens)."""
    return list(tokenizer(render_prompt(tokenizer, messages), add_special_tokens=False)["input_ids"])


@dataclass
class PromptDataset:
    """Validated rows in verl's schema; ``name`` says where they came from."""

    rows: list[dict[str, Any]]
    name: str = "rows"
    dropped: int = field(default=0)  # rows removed by filter_by_length

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def data_sources(self) -> set[str]:
        return {r["data_source"] for r in self.rows}

    def encode(self, tokenizer: Any) -> list[list[int]]:
        """Templated, tokenised prompt of every row (one batched tokenizer call)."""
        if not self.rows:
            return []
        texts = [render_prompt(tokenizer, r["prompt"]) for r in self.rows]
        return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def filter_by_length(self, tokenizer: Any, max_prompt_length: int) -> PromptDataset:
        """A dataset without the rows whose templated prompt exceeds ``max_prompt_length`` tokens."""
        return self.select_by_length(self.encode(tokenizer), max_prompt_length)[0]

    def select_by_length(
        self, encoded: list[list[int]], max_prompt_length: int
    ) -> tuple[PromptDataset, list[list[int]]]:
        """(rows whose ``encoded`` prompt fits, their encodings); logs how many were dropped."""
        keep = [i for i, ids in enumerate(encoded) if len(ids) <= max_prompt_length]
        dropped = len(self.rows) - len(keep)
        if dropped:
            get_logger("rlctl.data").warning(
                "prompts dropped: longer than max_prompt_length",
                dataset=self.name,
                dropped=dropped,
                kept=len(keep),
                max_prompt_length=max_prompt_length,
            )
        if not keep:
            raise UserError(
                f"{self.name}: every prompt is longer than max_prompt_length={max_prompt_length} tokens"
            )
        kept = PromptDataset([self.rows[i] for i in keep], self.name, self.dropped + dropped)
        return kept, [encoded[i] for i in keep]


def _parse_value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_builtin_spec(spec: str) -> tuple[str, dict[str, Any], int | None]:
    """``builtin:name?k=v&n=N`` -> (name, task options, n or None)."""
    body = spec[len(BUILTIN_PREFIX) :]
    name, _, query = body.partition("?")
    options = {k: _parse_value(v) for k, v in parse_qsl(query, keep_blank_values=True)}
    n = options.pop("n", None)
    if n is not None and (not isinstance(n, int) or n < 1):
        raise UserError(f"data spec {spec!r}: n must be a positive integer, got {n!r}")
    return name, options, n


def load_dataset(
    spec: str | Sequence[str], split: str = "train", seed: int = 0, limit: int | None = None
) -> PromptDataset:
    """Rows named by ``spec``: a built-in task's ``split`` (deterministic for ``seed``) or file(s).

    ``limit`` keeps only the first rows (after loading), e.g. for a quick validation pass.
    """
    if split not in SPLITS:
        raise UserError(f"data split must be one of {', '.join(SPLITS)}, got {split!r}")
    specs = [spec] if isinstance(spec, str) else list(spec)
    if not specs:
        raise UserError("data: no dataset given (expected builtin:<task> or a .jsonl/.parquet path)")
    rows: list[dict[str, Any]] = []
    for s in specs:
        if s.startswith(BUILTIN_PREFIX):
            name, options, n = parse_builtin_spec(s)
            rows.extend(get_task(name, **options).rows(split, n=n, seed=seed))
        else:
            rows.extend(read_rows(s))
    if not rows:
        raise UserError(f"data {', '.join(specs)}: no rows")
    if limit is not None:
        rows = rows[:limit]
    return PromptDataset(rows, name="+".join(specs))
