"""Gather the endpoint's concurrent requests into one batched ``generate`` on the rollout engine.

Requests wait until every episode whose agent is still running has one waiting (then the batch is
the same rows, in the same order, as the native multi-turn rollout's turn), or until no new
request arrived for ``gather_s`` seconds (an agent busy in a slow tool does not hold the others
up; None waits for all). Requests of one batch that ask for different sampling (temperature,
``top_p``, greedy) go to the engine as separate calls. Each choice of a request is one row; rows
sample up to the longest room among them and each keeps its own; ``max_batch`` caps the requests
of one engine call (``rlctl bench endpoint`` serves them one at a time with 1). ``generate`` runs on a thread so
the event loop keeps serving while the engine samples.

``generate`` is the engines' ``generate(prompt_ids, prompt_mask, *, n, temperature, top_p, top_k,
max_new_tokens, greedy, eos_token_id, pad_token_id, seed)`` (:mod:`rlctl.agents.rollout`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

Generate = Callable[..., dict[str, torch.Tensor]]
SEED_STRIDE = 1_000_033  # the native rollout's per-turn seed stride (rlctl.agents.rollout)


@dataclass
class Pending:
    episode: int
    ids: list[int]
    room: int
    n: int
    sampling: tuple[float, float, int, bool]  # temperature, top_p, top_k, greedy
    future: asyncio.Future = field(repr=False)


class Batcher:
    """``await sample(...)`` -> one (token ids, log-probs) per choice; batches as the module says."""

    def __init__(
        self,
        generate: Generate,
        *,
        eos_token_id: list[int],
        pad_token_id: int,
        seed: int | None,
        live: int,
        gather_s: float | None = None,
        max_batch: int = 0,
    ) -> None:
        self.generate, self.eos, self.pad, self.seed = generate, eos_token_id, pad_token_id, seed
        self.live, self.gather_s, self.max_batch = live, gather_s, max_batch  # max_batch 0: no limit
        self.pending: list[Pending] = []
        self.batches = 0  # engine calls made
        self.rows = 0  # rows sampled
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def agent_done(self) -> None:
        """An episode's agent returned: the batch no longer waits for it."""
        self.live -= 1
        self._wake.set()

    async def sample(
        self, episode: int, ids: list[int], room: int, n: int, sampling: tuple[float, float, int, bool]
    ) -> list[tuple[list[int], list[float]]]:
        future = asyncio.get_running_loop().create_future()
        self.pending.append(Pending(episode, ids, room, n, sampling, future))
        self._wake.set()
        return await future

    def _ready(self) -> bool:
        return len({p.episode for p in self.pending}) >= self.live

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self.pending:
                continue
            while not self._ready():
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), self.gather_s)
                except asyncio.TimeoutError:
                    break  # nothing new for gather_s: go with what is here
            batch, self.pending = sorted(self.pending, key=lambda p: p.episode), []
            await self._run(batch)

    async def _run(self, batch: list[Pending]) -> None:
        groups: dict[tuple[float, float, int, bool], list[Pending]] = {}
        for p in batch:
            groups.setdefault(p.sampling, []).append(p)
        calls = [
            (key, members[i : i + (self.max_batch or len(members))])
            for key, members in sorted(groups.items(), key=lambda kv: kv[1][0].episode)
            for i in range(0, len(members), self.max_batch or len(members))
        ]
        for g, (key, members) in enumerate(calls):
            seed = None if self.seed is None else self.seed + SEED_STRIDE * self.batches + 7919 * g
            try:
                out = await asyncio.get_running_loop().run_in_executor(
                    None, self._generate, members, key, seed
                )
            except Exception as exc:  # the engine failed: every waiting request learns it
                for p in members:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            for p, result in zip(members, out, strict=True):
                if not p.future.done():
                    p.future.set_result(result)
        self.batches += 1

    def _generate(
        self, members: list[Pending], key: tuple[float, float, int, bool], seed: int | None
    ) -> list[list[tuple[list[int], list[float]]]]:
        rows = [(p, p.ids) for p in members for _ in range(p.n)]
        width = max(len(ids) for _, ids in rows)
        prompt = torch.full((len(rows), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (_, ids) in enumerate(rows):
            prompt[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            mask[i, width - len(ids) :] = 1
        temperature, top_p, top_k, greedy = key
        with torch.inference_mode():
            out = self.generate(
                prompt,
                mask,
                n=1,
                max_new_tokens=max(p.room for p in members),
                eos_token_id=self.eos,
                pad_token_id=self.pad,
                seed=seed,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                greedy=greedy,
            )
        self.rows += len(rows)
        results: list[list[tuple[list[int], list[float]]]] = [[] for _ in members]
        index = {id(p): k for k, p in enumerate(members)}
        for i, (p, _) in enumerate(rows):
            keep = out["response_mask"][i].bool()
            toks = out["responses"][i][keep].tolist()[: p.room]
            if "rollout_log_probs" in out:
                lps = out["rollout_log_probs"][i][keep].tolist()[: p.room]
            else:  # an engine whose log-probs are not rlctl's convention reports none
                lps = [0.0] * len(toks)
            results[index[id(p)]].append((toks, lps))
        return results
