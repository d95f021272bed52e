"""Observation messages -> token ids in the model's own chat template, without re-rendering the episode.

Token-in, token-out: the episode's ids are only ever appended to. An observation is rendered as
the text the template puts after a finished assistant turn: the template is applied to a fixed
two-message context, then to that context plus the observation (with the generation prompt),
and the difference is the observation's text. Templates that rewrite earlier turns (Qwen3 drops
earlier ``<think>`` blocks) therefore never touch the tokens already sampled.

The model's turn ends at its stop token, while the template may close an assistant turn with
more (Qwen2.5: ``<|im_end|>`` then a newline); that remainder is prepended to the observation,
so the sequence is what the template would have produced. A template without a ``tool`` role
(the built-in tiny model's) gets tool results as a user turn: as they are by default (fewest
tokens), or wrapped the way Qwen2.5's template renders ``tool`` messages
(``tool_wrapper="<tool_response>\n{content}\n</tool_response>"``).
"""

from __future__ import annotations

from typing import Any

from rlctl.errors import UserError

_PROBE_USER = {"role": "user", "content": "rlctl-probe-question"}
_PROBE_ANSWER = "rlctl-probe-answer"


class ObservationRenderer:
    """``encode(messages, stop_text)`` -> ids to append after a model turn (ends with the generation
    prompt, so the next model turn continues from there)."""

    def __init__(
        self,
        tokenizer: Any,
        chat_template_kwargs: dict[str, Any] | None = None,
        tool_wrapper: str = "{content}",
    ) -> None:
        self.tokenizer = tokenizer
        self.tool_wrapper = tool_wrapper
        self.kwargs = dict(chat_template_kwargs or {})
        probe = [_PROBE_USER, {"role": "assistant", "content": _PROBE_ANSWER}]
        self._probe = probe
        self._base = self._render(probe, generation_prompt=False)
        cut = self._base.rfind(_PROBE_ANSWER)
        if cut < 0:
            raise UserError("the chat template drops assistant content: multi-turn rollout needs it")
        self._turn_end = self._base[cut + len(_PROBE_ANSWER) :]  # what closes an assistant turn
        self.tool_role = self._renders_tool_role()

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False, **self.kwargs
        )

    def _renders_tool_role(self) -> bool:
        try:
            self._render([*self._probe, {"role": "tool", "content": "x"}], generation_prompt=True)
        except Exception:  # jinja raise_exception on an unknown role
            return False
        return True

    def text(self, messages: list[dict[str, str]], stop_text: str | None = None) -> str:
        """The observation's text as the template renders it after an assistant turn that ended
        with the stop token ``stop_text`` (None: no stop token was sampled)."""
        if not self.tool_role:
            messages = [
                {"role": "user", "content": self.tool_wrapper.format(content=m["content"])}
                if m["role"] == "tool"
                else m
                for m in messages
            ]
        full = self._render([*self._probe, *messages], generation_prompt=True)
        if not full.startswith(self._base):
            raise UserError(
                "the chat template renders earlier messages differently when an observation follows; "
                "cannot append observations token-in/token-out"
            )
        close = self._turn_end
        if stop_text and close.startswith(stop_text):
            close = close[len(stop_text) :]  # the model already emitted the stop token
        return close + full[len(self._base) :]

    def encode(self, messages: list[dict[str, str]], stop_text: str | None = None) -> list[int]:
        """Token ids of :meth:`text` (special tokens in the template text are kept as such)."""
        return list(self.tokenizer(self.text(messages, stop_text), add_special_tokens=False)["input_ids"])
