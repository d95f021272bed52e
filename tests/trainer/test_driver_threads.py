"""The driver's torch threads while Ray workers compute: one, and the count it had comes back at shutdown."""

from __future__ import annotations

import torch

from rlctl.trainer.setup.context import RunContext, quiet_driver_threads


def _context(threads: int | None) -> RunContext:
    none = None
    return RunContext(
        profile=none, run_dir=none, platform=none, tokenizer=none, train_data=none, val_prompts=none,
        reward=none, policy=none, ref=none, critic=none, stop_ids=[], driver_threads=threads,
    )  # fmt: skip


def test_ray_driver_runs_one_thread_and_shutdown_restores_it():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        had = quiet_driver_threads("ray")
        assert had == 2 and torch.get_num_threads() == 1
        _context(had).shutdown()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_in_process_workers_keep_the_drivers_threads():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert quiet_driver_threads("inprocess") is None and torch.get_num_threads() == 2
        _context(None).shutdown()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
