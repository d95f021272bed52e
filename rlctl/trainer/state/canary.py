"""The canary after a weight sync: does the rollout engine *compute* with the trainer's weights?

The fingerprint (:mod:`.fingerprint`) checks the tensors the rollout engine *stores*. An engine can
store the right tensors and still compute with others: a captured graph that holds the addresses
of the old weights (vllm-ascend #7473 / #13902), a torn read in a custom all-reduce (vLLM #57059),
a fused copy that was never refreshed. So after each sync one fixed token sequence
(:data:`CANARY_LENGTH` tokens drawn once from a fixed seed over the vocabulary) is scored by the
rollout engine, through its own scoring path (``prompt_log_probs``: the HF model's forward; vLLM's
and SGLang's prompt-log-prob APIs), and by the training engine, both at temperature 1. The mean
absolute per-token gap must stay within the parity tolerance of the two computations' dtypes
(:func:`rlctl.engines.numerics.gap_tolerance`, the PASS bound of ``rlctl bench parity``'s
train-vs-rollout gap); above it the sync fails naming the engine, as a fingerprint mismatch does.

Cost: one forward of ``CANARY_LENGTH`` tokens on each side (plus one decoded token on vLLM and
SGLang; on one CPU thread, :func:`one_thread_on_cpu`), measured as ``sync/canary_s``.

When: after every sync, unless the rollout engine declares ``computes_with_stored_weights`` (its
forward reads the very tensors its ``weight_fingerprint`` reads, with no graph, fused copy or
other device holding weights of its own: the HF engine). There the fingerprint already proves
what it computes with, so the canary is a spot check of the numerics (:func:`canary_due`): the
load-time sync, the first update's and every :data:`SPOT_CHECK_EVERY`-th. On the built-in 1M-
parameter model its two forwards were 7.6 of the sync stage's 10.5 ms. The off-policy modes'
pushes are fingerprinted on the rollout workers, and canaried by the same rule.
Rounding errors are relative: the tolerance's error model takes logits of order one, as a flat
distribution has them (a random token's log-prob is then about ``-ln V``). A trained model spreads
its logits, the canary's random tokens fall far below the top, and each one's rounding error grows
with that distance (seen on an H200 in bfloat16: a healthy run's canary gap rose from 0.02 to 0.2
nats by step 46 of the built-in task). So the limit is the parity tolerance times
``max(1, mean |trainer log-prob| / ln V)`` (:func:`logit_spread`).

The differential test: a copy one update stale can sit well inside that limit (in bf16 on a 7B
model the limit is ~0.5 nats per token, a one-update gap ~0.24). So each check keeps both sides'
scores, and the next version's check asks whether the rollout engine *moved at all* while the
trainer's scores did: an engine that still computes with the previous weights scores the canary
exactly as it did at the previous sync (the same weights, the same 128 tokens, the same kernels),
so identical scores after an update that moved the trainer's fail the sync naming the engine
(:func:`frozen`). Detection: certain for a deterministic engine (the HF engine; vLLM's and SGLang's
single-sequence prompt log-probs are expected to be, not yet run on NVIDIA); an engine whose
scores jitter between identical calls escapes it. False alarm: only where an update changed no
weight the rollout copy stores (every change below half a bf16 step), which an update that moves
the trainer's bf16 scores cannot do under FSDP2's bf16 casts. A finer statistic was measured and
dropped: the share of the trainer's move the rollout engine's scores follow is not a test in bf16
(on the built-in task, bf16 autocast, a healthy copy followed between -1.7 and 1 of it over 100
steps: autocast keeps norms and embeddings fp32, whose small changes the bf16 copy rounds away).

Metrics: ``sync/canary_gap_mean`` /
``sync/canary_gap_max`` (nats), ``sync/canary_limit`` (the tolerance), ``sync/canary_ok`` (1
checked; -1 when the engine cannot score a sequence, said once in a warning),
``sync/canary_rollout_moved`` and ``sync/canary_trainer_moved`` (mean |change| of each side's
scores since the previous version, where it was scored).

The off-policy modes' rollout workers (:mod:`rlctl.trainer.workers.rollout`) run it on every
weight push: the trainer scores the canary when it publishes its weights
(:meth:`SyncCanary.trainer_scores`, shipped with them), the rollout worker scores it after loading
them and compares (:meth:`SyncCanary.compare`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch

from rlctl.engines.hf_model import resolve_dtype
from rlctl.engines.numerics import gap_tolerance, model_shape, vocab_size_of
from rlctl.errors import RunError
from rlctl.log import get_logger

LOGGER = "rlctl.trainer.sync"
CANARY_LENGTH = 128  # z of the differential test grows as sqrt(length)
CANARY_SEED = 20_240_607
SPOT_CHECK_EVERY = 10


def frozen(theirs: torch.Tensor, theirs_prev: torch.Tensor, ours: torch.Tensor, ours_prev: torch.Tensor) -> bool:
    """Whether the rollout engine scored the canary exactly as at the previous version while the
    trainer's scores moved (module docstring)."""
    moved = not torch.equal(ours.double().cpu(), ours_prev.double().cpu())
    return moved and torch.equal(torch.as_tensor(theirs).double().cpu(), theirs_prev.double().cpu())


def canary_due(version: int, rollout) -> bool:
    """Whether the sync that made weight version ``version`` (1: the load-time sync) runs the
    canary on ``rollout``: always, unless the engine declares ``computes_with_stored_weights``;
    then versions 1 and 2 and every :data:`SPOT_CHECK_EVERY`-th (module docstring)."""
    if not getattr(rollout, "computes_with_stored_weights", False):
        return True
    return version <= 2 or version % SPOT_CHECK_EVERY == 0


def canary_tokens(vocab_size: int, length: int = CANARY_LENGTH) -> list[int]:
    """The fixed canary sequence for a vocabulary: the same on every rank, step and run."""
    g = torch.Generator().manual_seed(CANARY_SEED)
    return torch.randint(0, vocab_size, (length,), generator=g).tolist()


def logit_spread(scores: torch.Tensor, vocab_size: int) -> float:
    """How far the canary's log-probs sit below a flat distribution's, as a factor >= 1 (module
    docstring); 1 where the vocabulary is unknown (``vocab_size`` < 2)."""
    if vocab_size < 2:
        return 1.0
    return max(1.0, float(scores.double().abs().mean()) / math.log(vocab_size))


def canary_batch(tokens: list[int]) -> dict[str, torch.Tensor]:
    """The training engine's batch for scoring ``tokens[1:]`` given what precedes each."""
    ids = torch.tensor([tokens], dtype=torch.long)
    ones = torch.ones_like(ids)
    return {
        "input_ids": ids,
        "attention_mask": ones,
        "position_ids": torch.arange(ids.shape[1])[None],
        "responses": ids[:, 1:],
        "response_mask": ones[:, 1:],
    }


@contextmanager
def one_thread_on_cpu(device) -> Iterator[None]:
    """On a CPU, torch's intra-op threads set to 1 for the block (restored after).

    A 32-token forward is too small to split: with two threads every op waits for both to be
    scheduled, which on a shared CPU costs far more than the op (measured on this 2-core host under
    load: 21 ms per canary on one thread, 1.2 s on two).
    """
    if torch.device(device).type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class SyncCanary:
    """Scores the canary on both sides after a sync; RunError naming the engine past the tolerance."""

    def __init__(self, *, rank: int = 0, train_dtype: str, rollout_dtype: str, on_device=nullcontext) -> None:
        """``on_device()`` is a context in which the actor's parameters are on its device (with
        param offload they live on the host between stages)."""
        self.rank = rank
        self.dtypes = (resolve_dtype(train_dtype), resolve_dtype(rollout_dtype))
        self.on_device = on_device
        self.warned = False
        # (version, the trainer's scores, the rollout engine's) at the last check
        self.last: tuple[int, torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def of_worker(cls, worker) -> SyncCanary | None:
        """The canary of a policy worker: its actor's compute dtype, its rollout's dtype, its rank
        (None without a spec or its engine settings: a worker built around bare engines, as the
        reshard bench's, has no trainer settings to compare in)."""
        spec = getattr(worker, "spec", None)
        engine = getattr(spec, "engine", None)
        if engine is None:
            return None
        train_dtype = engine.mixed_precision or engine.dtype
        return cls(
            rank=worker.rank,
            train_dtype=train_dtype,
            rollout_dtype=spec.rollout.dtype,
            on_device=worker._actor_on_device,
        )

    def trainer_scores(self, actor) -> tuple[list[int], torch.Tensor]:
        """The canary for ``actor``'s vocabulary and the training engine's log-probs of it (on the
        host). Collective under FSDP: every rank calls it together, with the actor on its device."""
        config = actor.model.config  # a model with fewer positions scores a shorter canary
        length = min(CANARY_LENGTH, int(getattr(config, "max_position_embeddings", None) or CANARY_LENGTH))
        tokens = canary_tokens(vocab_size_of(config), length)
        with one_thread_on_cpu(actor.device):
            ours = actor.compute_log_prob(canary_batch(tokens))["log_probs"][0]
        return tokens, ours.detach().cpu()

    def rollout_scores(self, rollout, tokens: list[int], device="cpu") -> torch.Tensor | None:
        """The rollout engine's log-probs of ``tokens[1:]`` through its own scoring path (None where
        the engine cannot score a sequence)."""
        score = getattr(rollout, "prompt_log_probs", None)
        if score is None:
            return None
        with one_thread_on_cpu(device):
            return score(tokens)

    def compare(
        self,
        theirs: torch.Tensor | None,
        ours: torch.Tensor,
        tokens: list[int],
        shape: tuple[int, int],
        version: int,
        engine: str,
        *,
        what: str = "weight sync",
        vocab_size: int = 0,
    ) -> dict[str, float]:
        """The ``sync/canary_*`` verdict (without ``sync/canary_s``) of the rollout engine's scores
        ``theirs`` against the trainer's ``ours``; ``shape`` is the model's ``(layers, hidden)``,
        ``vocab_size`` the canary's vocabulary (:func:`logit_spread`; 0: unscaled).
        RunError naming ``engine``, ``what`` ``version`` and this rank past the parity tolerance."""
        if theirs is None:
            if not self.warned:
                get_logger(LOGGER).warning(
                    "weight-sync canary not available (sync/canary_ok = -1)",
                    reason=f"{engine} cannot score a token sequence",
                )
                self.warned = True
            return {"sync/canary_ok": -1.0}
        gap = (ours.double().cpu() - torch.as_tensor(theirs).double().cpu()).abs()
        layers, hidden = shape
        tol = gap_tolerance(self.dtypes, layers=layers, hidden=hidden, seq_len=len(tokens))
        spread = logit_spread(ours, vocab_size)
        if spread > 1.0:
            tol = tol.scaled(spread, f"{tol.why}; x {spread:.3g}, the canary's logit spread")
        mean, worst = float(gap.mean()), float(gap.max())
        previous = self.last if self.last is not None and self.last[0] == version - 1 else None
        self.last = (version, ours.detach().double().cpu(), torch.as_tensor(theirs).double().cpu())
        if not mean <= tol.passes:
            raise RunError(
                f"{what} {version}: canary: the rollout engine {engine} scores the fixed "
                f"{len(tokens)}-token canary {mean:.4g} nats per token away from the trainer (max "
                f"{worst:.4g}), above the parity tolerance {tol.passes:.3g} ({tol.why}; rank "
                f"{self.rank}); its stored weights may be right, but it computes with others "
                "(a captured graph or fused copy holding old weights?)"
            )
        out = {
            "sync/canary_ok": 1.0,
            "sync/canary_gap_mean": mean,
            "sync/canary_gap_max": worst,
            "sync/canary_limit": tol.passes,
        }
        if previous is not None and previous[1].shape == ours.shape:
            if frozen(theirs, previous[2], ours, previous[1]):
                raise RunError(
                    f"{what} {version}: canary: the rollout engine {engine} scores the fixed "
                    f"{len(tokens)}-token canary exactly as it did with the previous weights, while "
                    f"the trainer's scores moved (rank {self.rank}), though within the limit "
                    f"{tol.passes:.3g} ({mean:.4g} nats per token): it computes with weights one "
                    "update old"
                )
            their_move = torch.as_tensor(theirs).double().cpu() - previous[2]
            out["sync/canary_rollout_moved"] = float(their_move.abs().mean())
            out["sync/canary_trainer_moved"] = float((ours.double().cpu() - previous[1]).abs().mean())
        return out

    def check(self, actor, rollout, version: int) -> dict[str, float]:
        """``actor`` is the training engine (``compute_log_prob``), ``rollout`` the rollout engine."""
        start = time.perf_counter()
        with self.on_device():
            tokens, ours = self.trainer_scores(actor)  # collective under FSDP
            theirs = self.rollout_scores(rollout, tokens, actor.device)
        shape = model_shape(actor.model.config)
        out = self.compare(
            theirs,
            ours,
            tokens,
            shape,
            version,
            type(rollout).__name__,
            vocab_size=vocab_size_of(actor.model.config),
        )
        return {**out, "sync/canary_s": time.perf_counter() - start}
