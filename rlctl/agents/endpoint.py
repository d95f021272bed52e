"""Episodes run by the user's own agent code through an OpenAI-compatible endpoint on the engine.

For each row, ``await agent(client, row)`` runs with an ``openai.AsyncOpenAI`` client whose
``base_url`` is this rank's loopback server (:mod:`.http_server`, a fresh token per call); its
requests are batched into the rollout engine's ``generate`` (:mod:`.batcher`) and recorded token
for token (:mod:`.trajectory`). The result has the native rollout's batch layout
(:func:`rlctl.agents.rollout.run_episodes`): the episode's last chain laid out as prompt and
response, ``response_mask`` 1 on sampled tokens only, ``rollout_log_probs`` their sampling
log-probs. The agent's return value is read by :mod:`.outcome` (``agent.reward``): a number or a
bool is the reward, a string the final answer the profile's reward scores, None leaves it to the
profile's reward on the decoded model tokens. An agent that raises gets reward 0 and is counted
(``agent/agent_errors``, its first error logged); when every agent raised, the rollout fails.

Limits, as in the native rollout: ``max_turns`` requests per episode, ``max_turn_tokens`` per
answer, ``max_tokens`` for the whole response (answers and the context between them). A request
past a limit gets an empty answer with ``finish_reason = "length"`` and marks the episode truncated.
"""

from __future__ import annotations

import asyncio
import math
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlctl.agents.answers import make_answer
from rlctl.agents.batcher import Batcher, Generate
from rlctl.agents.chat import normalise, render, renders_tool_role
from rlctl.agents.completions import ApiError, ChatRequest, Choice, completion, stream_chunks
from rlctl.agents.http_server import EndpointServer
from rlctl.agents.outcome import Outcome, read_outcome
from rlctl.agents.rows import assemble
from rlctl.agents.trajectory import EpisodeTrace
from rlctl.errors import RunError, UserError
from rlctl.log import get_logger

AgentFn = Callable[[Any, dict[str, Any]], Any]
log = get_logger(__name__)


def make_client(base_url: str, token: str) -> Any:
    """The ``openai.AsyncOpenAI`` client an agent gets (no retries: an error reaches the agent)."""
    try:
        import openai
    except ImportError:
        raise UserError(
            "agent.openai_agent needs the openai package: pip install 'rlctl[agent]' (or pip install openai)"
        ) from None
    return openai.AsyncOpenAI(base_url=base_url, api_key=token, max_retries=0, timeout=3600.0)


class EndpointRollout:
    """One call's server, batcher and traces; :meth:`run` plays every row's episode."""

    def __init__(
        self,
        generate: Generate,
        tokenizer: Any,
        agent: AgentFn,
        rows: Sequence[dict[str, Any]],
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        max_turns: Sequence[int],
        max_tokens: int,
        max_turn_tokens: int,
        eos_token_id: list[int],
        pad_token_id: int,
        seed: int | None,
        sampling: dict[str, Any],
        gather_s: float | None = None,
        max_batch: int = 0,
        reward_mode: str = "agent",
    ) -> None:
        self.generate, self.tokenizer, self.agent, self.rows = generate, tokenizer, agent, list(rows)
        self.max_turns, self.max_tokens, self.max_turn_tokens = list(max_turns), max_tokens, max_turn_tokens
        self.eos, self.pad, self.seed, self.gather_s = eos_token_id, pad_token_id, seed, gather_s
        self.sampling, self.max_batch, self.reward_mode = sampling, max_batch, reward_mode
        self.tool_role = renders_tool_role(tokenizer)
        self.prompt_ids, self.prompt_mask = prompt_ids, prompt_mask
        self.traces = [EpisodeTrace(prompt_width=prompt_ids.shape[1]) for _ in self.rows]
        self.turns = [0] * len(self.rows)
        self.tool_calls = [0] * len(self.rows)
        self.tool_errors = [0] * len(self.rows)
        self.outcomes = [Outcome() for _ in self.rows]
        self.failed: list[BaseException | None] = [None] * len(self.rows)
        self.server: EndpointServer | None = None
        self.engine_error: BaseException | None = None
        self.batcher: Batcher | None = None

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _sampling(self, req: ChatRequest) -> tuple[float, float, int, bool]:
        s = self.sampling
        temperature = s.get("temperature", 1.0) if req.temperature is None else req.temperature
        top_p = s.get("top_p", 1.0) if req.top_p is None else req.top_p
        greedy = bool(s.get("greedy", False)) or temperature == 0.0
        return (float(temperature) if not greedy else 1.0, float(top_p), int(s.get("top_k", 0)), greedy)

    async def handle(self, episode: int, req: ChatRequest) -> Any:
        """Serve one request of ``episode``: the JSON reply, or the SSE events of a streamed one."""
        trace = self.traces[episode]
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        msgs = normalise(req.messages, tool_role=self.tool_role, sampled_text=trace.sampled_text)
        try:
            text = render(self.tokenizer, msgs, req.tools or None)
        except Exception as exc:
            raise ApiError(400, f"the model's chat template cannot render these messages: {exc}") from None
        trace.requests += 1
        ctx = trace.context(text, self._encode)
        room = self.max_tokens - ctx.response_len
        for cap in (req.max_tokens, self.max_turn_tokens):
            if cap:
                room = min(room, cap)
        if room <= 0 or self.turns[episode] >= self.max_turns[episode]:
            trace.truncated = True
            empty = Choice(content="", tool_calls=[], finish_reason="length", tokens=[], log_probs=[])
            return self._reply(rid, req, [empty] * req.n, len(ctx.ids))
        self.turns[episode] += 1
        assert self.batcher is not None
        try:
            sampled = await self.batcher.sample(episode, ctx.ids, room, req.n, self._sampling(req))
        except Exception as exc:  # the engine failed: the run fails after this call, saying so
            self.engine_error = self.engine_error or exc
            raise ApiError(500, f"the rollout engine failed: {type(exc).__name__}: {exc}") from None
        choices = []
        for k, (ids, lps) in enumerate(sampled):
            ans = make_answer(
                self.tokenizer, ids, lps, stops=req.stop, eos=set(self.eos), parse_tools=req.parse_tools
            )
            text = self.tokenizer.decode(ans.ids, skip_special_tokens=False)
            trace.record(ctx.extended(ans.ids, text, True, ans.log_probs), first=k == 0)
            for call in ans.choice.tool_calls:
                trace.raw_by_call[call["id"]] = ans.raw
            if ans.choice.content is not None and ans.choice.content != ans.raw:
                trace.raw_by_content[ans.choice.content] = ans.raw
            if k == 0:
                trace.conversation = [*msgs, {"role": "assistant", "content": ans.raw}]
                self.tool_calls[episode] += len(ans.choice.tool_calls) + ans.tool_errors
                self.tool_errors[episode] += ans.tool_errors
            choices.append(ans.choice)
        return self._reply(rid, req, choices, len(ctx.ids))

    @staticmethod
    def _reply(rid: str, req: ChatRequest, choices: list[Choice], prompt_tokens: int) -> Any:
        if req.stream:
            return stream_chunks(rid, req, choices, prompt_tokens)
        return completion(rid, req, choices, prompt_tokens)

    async def _episode(self, i: int, client: Any) -> None:
        assert self.batcher is not None
        try:
            self.outcomes[i] = read_outcome(await self.agent(client, dict(self.rows[i])), self.reward_mode)
        except Exception as exc:  # the agent's failure is its episode's, not the run's
            self.failed[i] = exc
        finally:
            self.batcher.agent_done()

    async def _main(self) -> None:
        self.server = EndpointServer(self.handle, len(self.rows))
        await self.server.start()
        self.batcher = Batcher(
            self.generate,
            eos_token_id=self.eos,
            pad_token_id=self.pad,
            seed=self.seed,
            live=len(self.rows),
            gather_s=self.gather_s,
            max_batch=self.max_batch,
        )
        self.batcher.start()
        base = make_client(self.server.base_url(0), self.server.token)
        try:
            await asyncio.gather(
                *(
                    self._episode(i, base.with_options(base_url=self.server.base_url(i)))
                    for i in range(len(self.rows))
                )
            )
        finally:
            await self.batcher.stop()
            await base.close()
            await self.server.close()

    def answers(self) -> list[str]:
        """Each episode's final answer as the agent returned it ("" where it returned none:
        ``agent_answered`` says which)."""
        return [o.answer or "" for o in self.outcomes]

    def conversations(self) -> list[list[dict[str, Any]]]:
        """Each episode's last request (as rendered) and its first answer, for the run's samples."""
        return [t.conversation for t in self.traces]

    def run(self) -> dict[str, torch.Tensor]:
        """Play every episode; the batch tensors (the native rollout's keys and ``agent_*`` columns)."""
        _run_loop(self._main())
        failure = self.engine_error or (self.server.failure if self.server else None)
        if failure is not None:
            raise RunError(
                f"rollout: serving the agent endpoint failed: {type(failure).__name__}: {failure}"
            ) from failure
        errors = [e for e in self.failed if e is not None]
        if errors:
            first = errors[0]
            log.warning("agent_errors", count=len(errors), first=f"{type(first).__name__}: {first}")
            if len(errors) == len(self.rows):
                raise RunError(
                    f"rollout: every one of {len(errors)} agent episodes raised; the first: "
                    f"{type(first).__name__}: {first}"
                ) from first
        ok = [o if self.failed[i] is None else Outcome(reward=0.0) for i, o in enumerate(self.outcomes)]
        return assemble(
            [t.row() for t in self.traces],
            self.prompt_ids,
            self.prompt_mask,
            self.max_tokens,
            self.pad,
            turns=self.turns,
            tool_calls=self.tool_calls,
            tool_errors=self.tool_errors,
            rewards=[math.nan if o.reward is None else o.reward for o in ok],
            answered=[o.answer is not None for o in ok],
            truncated=[t.truncated for t in self.traces],
            mismatches=[t.mismatches for t in self.traces],
            failed=[e is not None for e in self.failed],
        )


def _run_loop(coro: Any) -> None:
    """``asyncio.run`` here, or on a thread when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coro)
        return
    box: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(coro)
        except BaseException as exc:  # handed back to the caller's thread
            box.append(exc)

    t = threading.Thread(target=target, name="rlctl-endpoint")
    t.start()
    t.join()
    if box:
        raise box[0]
