"""Carried partial rollouts (``trainer.partial_rollouts = "carry"``, async): no round waits for its
longest response.

A generation's cost is set by its longest response: the long tail decodes a few rows while the rest
wait. Here a generation round stops once at most ``trainer.carry_stop_share`` of its rows is still
running; those rows go on in the next round beside fresh prompts, under the newest weights the
rollout workers then hold (Kimi k1.5's partial rollouts; verl's and OpenRLHF's async partial
rollout). A batch is the first prompt groups whose ``n`` responses are all complete, so the tail
decodes beside full rounds of new rows instead of alone.

A carried row goes on as prompt + its tokens so far: the engine reads it afresh under the weights it
holds (the KV cache recomputed), so each later token's behaviour log-prob is the score of the
weights that sampled it, and every token keeps that version (``token_versions``). The staleness
bound stays hard per token: before each round, and again when a batch is taken, a row whose oldest
token is older than the batch being made may hold starts over (``async/restarted_rows``); a round
holding a row that started over is not cut, so each row starts over at most once and no prompt
starves (the longest answers would otherwise be cut, carried past the bound and started over again).

What a checkpoint must keep: the prompts drawn but not yet trained (rows in flight, groups complete
but not yet handed out), :meth:`CarriedRollouts.untrained`; a resume generates them first.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rlctl.data.batcher import left_pad
from rlctl.dispatch import DataProto
from rlctl.engines.logprob import position_ids_from_mask

COUNTS = ("rounds", "restarted", "rows", "carried")  # what metrics() reports since its last call


@dataclass
class _Row:
    """One response so far: its tokens, each token's behaviour log-prob and weight version."""

    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    done: bool = False
    rounds: int = 0  # generation rounds it took part in
    restarted: bool = False  # started over once: never cut again (no row starves)

    def oldest(self) -> int | None:
        return min(self.versions) if self.versions else None


@dataclass
class _Group:
    """One prompt and its ``n`` responses; complete when every response is."""

    prompt: list[int]  # unpadded token ids
    columns: dict[str, Any]  # the prompt's non-tensor values
    rows: list[_Row]

    def complete(self) -> bool:
        return all(r.done for r in self.rows)


class CarriedRollouts:
    """A rollout group's sampler that carries unfinished rows from one round to the next.

    ``generate_sequences(request)`` takes the request's prompts (``n`` adjacent rows each, with
    their non-tensor columns), runs rounds (drawing ``draw()`` fresh prompts for every round after
    the first, so no round runs on the tail alone) until as many groups as the request holds are
    complete, and returns those groups' rows with their own columns: the oldest-drawn complete
    groups first, which need not be the request's (``returns_rows``).
    """

    returns_rows = True  # the rows returned carry their own prompt columns (Trainer.generate)

    def __init__(
        self,
        group: Any,
        draw: Callable[[], DataProto],
        *,
        n: int,
        max_new_tokens: int,
        stop_share: float,
        pad_token_id: int,
    ) -> None:
        self.group, self.draw, self.n = group, draw, n
        self.max_new_tokens, self.stop_share, self.pad = max_new_tokens, stop_share, pad_token_id
        self.flight: list[_Group] = []  # drawn, not all responses complete (draw order)
        self.complete: list[_Group] = []  # complete, not handed out yet (completion order)
        self.required = 0  # the oldest weight version the batch being made may hold (set per batch)
        self.counts = dict.fromkeys(COUNTS, 0)

    # -- the stage's side ---------------------------------------------------------------------------
    def generate_sequences(self, request: DataProto) -> DataProto:
        want = len(request) // self.n
        self.add(request[:: self.n])
        seed = int(request.meta["seed"])
        for round_ in itertools.count():
            if round_:  # a round is never the tail alone: fresh prompts beside the carried rows
                self.add(self.draw())
            self._round(request.meta, seed + 7919 * round_)
            if self._take_ready(want):
                break
        groups, self.complete = self.complete[:want], self.complete[want:]
        return self._rows(groups)

    def add(self, prompts: DataProto) -> None:
        """Queue ``prompts`` (one row each, with their non-tensor columns) for the next round."""
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
        for i in range(len(prompts)):
            columns = {k: v[i] for k, v in prompts.non_tensor.items()}
            self.flight.append(_Group(ids[i][mask[i]].tolist(), columns, [_Row() for _ in range(self.n)]))

    def untrained(self) -> DataProto | None:
        """The prompts drawn but not handed out (in flight, or complete and waiting), one row each:
        what a checkpoint keeps so a resume generates them again (their tokens are not kept)."""
        groups = self.complete + self.flight
        if not groups:
            return None
        ids, mask, _ = left_pad([g.prompt for g in groups], self.pad)
        columns = {k: [g.columns[k] for g in groups] for k in groups[0].columns}
        return DataProto.from_dict({"input_ids": ids, "attention_mask": mask}, columns)

    def metrics(self) -> dict[str, float]:
        """``async/carry_*`` since the last call: rounds, rows started over, share of the handed-out
        rows that spanned more than one round."""
        c, self.counts = self.counts, dict.fromkeys(COUNTS, 0)
        return {
            "async/carry_rounds": float(c["rounds"]),
            "async/restarted_rows": float(c["restarted"]),
            "async/carried_rows_frac": c["carried"] / c["rows"] if c["rows"] else 0.0,
        }

    # -- rounds -------------------------------------------------------------------------------------
    def _round(self, meta: dict[str, Any], seed: int) -> None:
        """One generation of every unfinished row, cut once ``stop_share`` of them still runs (not
        cut when a row that started over is among them)."""
        self._restart_stale(self.flight)
        pairs = [(g, r) for g in self.flight for r in g.rows if not r.done]
        live = [r for _, r in pairs]
        ids, mask, _ = left_pad([g.prompt + r.tokens for g, r in pairs], self.pad)
        limits = torch.tensor([self.max_new_tokens - len(r.tokens) for r in live])
        request = DataProto.from_dict(
            {"input_ids": ids, "attention_mask": mask, "limits": limits},
            meta={**meta, "seed": seed, "stop_share": 0.0 if any(r.restarted for r in live) else self.stop_share,
                  "max_new_tokens": int(limits.max())},
        )
        out = self.group.generate_sequences(request).batch
        for i, row in enumerate(live):
            keep = out["response_mask"][i].bool()
            row.tokens += out["responses"][i][keep].tolist()
            row.log_probs += out["rollout_log_probs"][i][keep].tolist()
            row.versions += out["token_versions"][i][keep].tolist()
            row.done = bool(out["finished"][i])
            row.rounds += 1
        self.counts["rounds"] += 1
        done = [g for g in self.flight if g.complete()]
        self.flight = [g for g in self.flight if not g.complete()]
        self.complete += done

    def _take_ready(self, want: int) -> bool:
        """Whether ``want`` complete groups within the bound are ready (stale ones start over)."""
        stale = self._restart_stale(self.complete)
        self.complete = [g for g in self.complete if g not in stale]
        self.flight = stale + self.flight
        return len(self.complete) >= want

    def _restart_stale(self, groups: list[_Group]) -> list[_Group]:
        """Start over every row of ``groups`` holding a token older than ``required``; the groups hit."""
        hit = []
        for g in groups:
            old = [r for r in g.rows if (v := r.oldest()) is not None and v < self.required]
            for r in old:
                r.tokens, r.log_probs, r.versions, r.done, r.rounds, r.restarted = [], [], [], False, 0, True
            self.counts["restarted"] += len(old)
            if old:
                hit.append(g)
        return hit

    def _rows(self, groups: list[_Group]) -> DataProto:
        """The groups' rows as the engines return them (left-padded prompts, responses padded to
        ``max_new_tokens``), each with its prompt's columns and its oldest token's version."""
        rows = [(g, r) for g in groups for r in g.rows]
        prompts, pmask, _ = left_pad([g.prompt for g, _ in rows], self.pad)
        width = self.max_new_tokens

        def padded(values: list[list[Any]], fill: Any, dtype: torch.dtype) -> torch.Tensor:
            out = torch.full((len(values), width), fill, dtype=dtype)
            for i, v in enumerate(values):
                out[i, : len(v)] = torch.tensor(v, dtype=dtype)
            return out

        responses = padded([r.tokens for _, r in rows], self.pad, prompts.dtype)
        rmask = padded([[1] * len(r.tokens) for _, r in rows], 0, pmask.dtype)
        mask = torch.cat([pmask, rmask], 1)
        versions = padded([r.versions for _, r in rows], 0, torch.long)
        oldest = torch.tensor([r.oldest() for _, r in rows], dtype=torch.long)
        self.counts["rows"] += len(rows)
        self.counts["carried"] += sum(r.rounds > 1 for _, r in rows)
        tensors = {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": mask,
            "position_ids": position_ids_from_mask(mask),
            "response_mask": rmask,
            "rollout_log_probs": padded([r.log_probs for _, r in rows], 0.0, torch.float32),
            "token_versions": versions,
            "weight_version": oldest,
        }
        columns = {k: [g.columns[k] for g, _ in rows] for k in groups[0].columns}
        return DataProto.from_dict(tensors, columns, meta={"weight_version": int(oldest.min())})
