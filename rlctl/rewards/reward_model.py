"""A reward model as a scorer: a sequence-classification head read from a local HF directory.

The prompt messages plus the response as an assistant turn go through the reward model's own
chat template (when it has one) and the single logit is the score, as in verl's RM worker.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlctl.errors import UserError
from rlctl.platforms.hub_kernels import no_hub_kernels


class RewardModelScorer:
    """Scores (prompt messages, response) pairs with ``AutoModelForSequenceClassification``."""

    def __init__(
        self, path: str | Path, device: str = "cpu", max_length: int = 1024, batch_size: int = 32
    ) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        p = Path(path)
        if not (p / "config.json").is_file():
            raise UserError(f"reward model path {p} is not a model directory (no config.json)")
        self.tokenizer = AutoTokenizer.from_pretrained(p)
        self.model = AutoModelForSequenceClassification.from_pretrained(p, **no_hub_kernels()).to(device).eval()
        if self.model.config.num_labels != 1:
            raise UserError(
                f"reward model {p}: expected num_labels=1 (one score), got {self.model.config.num_labels}"
            )
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id or self.tokenizer.eos_token_id
        self.device, self.max_length, self.batch_size = device, max_length, batch_size

    def render(self, prompt: list[dict[str, str]], response: str) -> str:
        messages = [*prompt, {"role": "assistant", "content": response}]
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages, tokenize=False)
        return "\n".join(m["content"] for m in messages)

    @torch.no_grad()
    def score(self, prompts: list[list[dict[str, str]]], responses: list[str]) -> list[float]:
        """One float per pair: the reward model's logit."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        texts = [self.render(p, r) for p, r in zip(prompts, responses, strict=True)]
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(
                texts[start : start + self.batch_size],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.max_length,
                add_special_tokens=False,
            ).to(self.device)
            logits = self.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
            scores.extend(logits[:, 0].float().cpu().tolist())
        return scores
