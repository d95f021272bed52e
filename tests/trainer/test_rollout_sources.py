"""The one loop given a rollout source: the modes' table, and a source the loop has never seen.

The second test plugs a toy source into the real loop (tiny model, in-process workers): it lives
in this file only, subclasses nothing and touches no loop code, which is the claim of
``docs/architecture.md`` (a new source is its own module plus its branch in ``loops/modes.py``).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from types import SimpleNamespace

import pytest
import torch

from rlctl.dispatch import DataProto
from rlctl.errors import RunError
from rlctl.profile import load_profile
from rlctl.trainer.loops.colocated import Colocated
from rlctl.trainer.loops.modes import rollout_source
from rlctl.trainer.loops.pipelined import Pipeline
from rlctl.trainer.loops.source import Rollout
from tests.trainer.test_train_e2e import by_step, metrics


def ctx_for(tmp_path, trainer: str):
    (tmp_path / "p.toml").write_text(f'[model]\npath = "m"\n[trainer]\n{trainer}')
    return SimpleNamespace(profile=load_profile(tmp_path / "p.toml"), train_data=None)


@pytest.mark.parametrize(
    ("trainer", "kind", "exact", "bound"),
    [
        ("", Colocated, None, None),
        ('mode = "one_step_off"\nmax_staleness = 3\n', Pipeline, True, 1),  # always exactly one behind
        ('mode = "async"\nmax_staleness = 3\n', Pipeline, False, 3),
    ],
)
def test_each_mode_is_one_source_with_its_two_rules(tmp_path, trainer, kind, exact, bound):
    source = rollout_source(ctx_for(tmp_path, trainer))
    assert type(source) is kind
    if kind is Pipeline:
        assert (source.exact, source.max_staleness) == (exact, bound)


def test_a_pipeline_refuses_a_batch_past_its_bound(tmp_path):
    source = Pipeline(ctx_for(tmp_path, ""), exact=False, max_staleness=2)
    versions = torch.tensor([3, 5, 4])
    rollout = Rollout(DataProto.from_dict(tensors={"weight_version": versions}), versions)
    out = source.staleness(rollout, step=5)
    assert out["async/staleness_max"] == 2 and out["async/staleness_mean"] == 1
    assert out["rollout/weight_version"] == 3  # the oldest sample's
    with pytest.raises(RunError, match="staleness 3 above the bound 2"):
        source.staleness(rollout, step=6)


class OneBehind:
    """A toy source: each step trains the batch the colocated engine generated one step earlier
    (version ``step - 1``), and generates the next one now. No thread, no rollout workers."""

    colocated = True  # it samples on the policy's own engine: the loop syncs it every step

    def __init__(self, ctx) -> None:
        self.ctx, self.held, self.reported = ctx, None, []

    @contextmanager
    def running(self, stage, *, done: int, last: int):
        self.stage = stage
        yield

    def _make(self, index: int, version: int, timer) -> Rollout:
        batch, counts = self.stage(timer, index, self.ctx.policy)
        return Rollout(batch, torch.full((len(batch),), version, dtype=torch.long), counts)

    def next(self, step: int, timer) -> Rollout:
        out = self.held if self.held is not None else self._make(step, step, timer)
        self.held = self._make(step + 1, step, timer)  # batch step + 1 with this step's weights
        return out

    def publish(self, step: int, timer) -> None:
        pass

    def staleness(self, rollout: Rollout, step: int) -> dict[str, float]:
        self.reported.append(rollout.lag(step).tolist())
        return {"toy/lag_max": float(rollout.lag(step).max())}

    def paused(self):
        return nullcontext()

    def prompt_state(self) -> dict:
        return self.ctx.train_data.state_dict()

    def save(self, checkpoint, step: int) -> None:
        pass

    def load(self, checkpoint) -> None:
        pass


@pytest.mark.timeout(300)
def test_the_loop_runs_a_source_it_has_never_seen(write_profile, tmp_path):
    from rlctl.trainer.loops.sync import Trainer
    from rlctl.trainer.plan.run_plan import resolve_plan
    from rlctl.trainer.setup.context import build_context

    profile = load_profile(write_profile("toy", steps=3, entropy_coeff=0.01))
    run_dir = tmp_path / "runs/toy"
    run_dir.mkdir(parents=True)
    ctx = build_context(profile, run_dir, resolve_plan(profile))
    source = OneBehind(ctx)
    try:
        Trainer(ctx, source=source).fit()
    finally:
        ctx.shutdown()
    steps = by_step(metrics(run_dir))
    assert source.reported == [[0] * 16, [1] * 16, [1] * 16]  # 4 prompts x n = 4, as it said
    assert [steps[s]["toy/lag_max"] for s in (1, 2, 3)] == [0.0, 1.0, 1.0]
    # the loop reads the lag the source reported: the gap alarm watches only on-policy batches
    assert "rollout/log_prob_diff_mean" in steps[1] and "async/log_prob_diff_mean" not in steps[1]
    for s in (2, 3):
        assert "async/log_prob_diff_mean" in steps[s] and "rollout/log_prob_diff_mean" not in steps[s]
    assert all(steps[s]["sync/fingerprint_ok"] == 1.0 for s in (1, 2, 3))  # synced every step
