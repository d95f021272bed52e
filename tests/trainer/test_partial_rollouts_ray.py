"""Partial rollouts on Ray: a rollout worker in another process polls the driver's
:class:`~rlctl.dispatch.version_board.RayVersionBoard` between decode steps, fetches the newer
weights from the object store, and its rows go on under them; an async run with partial rollouts
on Ray completes within the staleness bound."""

from __future__ import annotations

import pytest
import torch

from rlctl.dispatch import DataProto
from rlctl.dispatch.futures import CallInfo, LazyInput
from rlctl.dispatch.mesh import Mesh
from rlctl.dispatch.version_board import RayVersionBoard
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.trainer.workers.weight_streams import PublishedWeights
from tests.trainer.test_async_modes import train
from tests.trainer.test_partial_rollouts import _worker

PARTIAL = 'mode = "async"\nmax_staleness = 1\npartial_rollouts = "swap"\n'


def _as_list(mesh: Mesh, values: dict) -> list:
    """The collect function of a one-rank ``full_weights`` call: its output, a list."""
    return values[0]


class Held:
    """Holds the board's answers back for the generation's first ``after - 1`` polls (so the swap
    lands mid-generation), then asks the real board."""

    def __init__(self, board: RayVersionBoard, after: int) -> None:
        self.board, self.after, self.asked = board, after, 0

    def newer(self, than: int):
        self.asked += 1
        return None if self.asked < self.after else self.board.newer(than)


class RolloutActor:
    """A rollout worker at version 3 in a Ray process of its own."""

    def generate(self, model: str, board: RayVersionBoard, after: int) -> tuple:
        worker, engine = _worker(model, 3)
        worker.attach_board(Held(board, after))
        prompts = DataProto.from_dict(
            tensors={"input_ids": torch.randint(3, 30, (4, 5)), "attention_mask": torch.ones(4, 5, dtype=torch.long)},
            meta={"max_new_tokens": 12, "eos_token_id": None, "pad_token_id": 0, "seed": 1},
        )
        out = worker.generate_sequences(prompts)
        version, checks = worker.swapped
        return out.batch["token_versions"], out.batch["response_mask"], version, checks, engine.local_tensors()


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_a_ray_rollout_worker_swaps_to_the_boards_newer_weights_mid_generation(tiny_model, ray_session):
    ray = ray_session
    engine = HFRolloutEngine(tiny_model, dtype="float32")
    torch.manual_seed(0)
    new = {n: t.detach().clone() + 0.05 * torch.randn_like(t) for n, t in engine.local_tensors().items()}
    ref = ray.put([PublishedWeights(new)])  # as a full_weights call's output in the object store
    board = RayVersionBoard()
    try:
        board.post(3, None)
        assert board.newer(3) is None  # nothing newer: the version alone answers
        board.post(4, LazyInput(CallInfo("actor", "full_weights"), {0: ref}, _as_list, Mesh.of(None, 1), ("item", 0)))
        board.post(2, None)  # an older post never replaces a newer one
        actor = ray.remote(num_cpus=1)(RolloutActor).remote()
        tokens, mask, version, checks, held = ray.get(actor.generate.remote(tiny_model, board, 3))
    finally:
        board.close()
    mask = mask.bool()
    assert tokens[mask].min() == 3 and tokens[mask].max() == 4  # both versions, none older than the start
    assert tokens[:, :3].eq(3).all() and tokens[:, 3:][mask[:, 3:]].eq(4).all()  # swapped after token 3
    assert version == 4 and checks["sync/fingerprint_ok"] == 1.0
    for name, t in held.items():
        assert torch.equal(t, new[name]), name


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_async_run_with_partial_rollouts_on_ray_swaps_mid_generation_within_the_bound(write_profile, ray_session):
    """On the random-weight tiny model responses run to ~60 of 96 tokens, so a generation (96
    decode steps) outlasts a training step and the next publish lands while it runs."""
    path = write_profile("ray-partial", backend="ray", extra=PARTIAL)
    path.write_text(path.read_text().replace("max_new_tokens = 4", "max_new_tokens = 96"))
    steps = train(path)
    assert sorted(steps) == list(range(5))
    for step in range(1, 5):
        assert steps[step]["async/staleness_max"] <= 1, step  # no token older than the bound
        assert steps[step]["sync/fingerprint_ok"] == 1.0, step  # every push and swap checked
    assert max(steps[s]["async/swapped_rows_frac"] for s in range(1, 5)) > 0  # rows spanning two versions
