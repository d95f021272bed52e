"""``spawn_ranks``: a finished rank leaves without interpreter teardown; a failing one still reports."""

from __future__ import annotations

import atexit
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from rlctl.dispatch.local_ranks import spawn_ranks


def _writes_then_returns(rank: int, out: str) -> None:
    atexit.register(lambda: Path(f"{out}/teardown{rank}").write_text("ran"))  # teardown would run this
    Path(f"{out}/done{rank}").write_text(str(rank))


def _rank_one_raises(rank: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 cannot go on")


def test_finished_ranks_keep_their_files_and_skip_teardown(tmp_path):
    spawn_ranks(_writes_then_returns, 2, (str(tmp_path),))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done0", "done1"]
    assert (tmp_path / "done1").read_text() == "1"


def test_a_failing_rank_raises_with_its_traceback():
    with pytest.raises(mp.ProcessRaisedException, match="rank 1 cannot go on"):
        spawn_ranks(_rank_one_raises, 2)
