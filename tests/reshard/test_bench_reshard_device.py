"""``rlctl bench reshard --device``: refusals, skips, and the accelerator code path run on the host.

The accelerator branch of :class:`rlctl.bench.reshard.BenchDevice` reads one torch device module
(``torch.cuda``). ``FakeCuda`` swaps in a module with the surface the bench calls (``device_count``,
``set_device``, ``synchronize``, ``Event(enable_timing=True)`` with ``record`` / ``synchronize`` /
``elapsed_time`` in ms, ``reset_peak_memory_stats``, ``memory_allocated``, ``max_memory_allocated``)
backed by host tensors, so the same spawned ranks run that branch here.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pytest
import torch
from click.testing import CliRunner

from rlctl.bench.reshard import BenchDevice, bench, resolve_device, rows_json, skip_reason

FAKE_BASE = 3 << 20
FAKE_PEAK = FAKE_BASE + (5 << 20)  # the fake allocator's high-water: 5 MiB above the ready state


class _Event:
    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.t: float | None = None

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _Event) -> float:
        assert self.t is not None and end.t is not None, "elapsed_time on an event never recorded"
        return (end.t - self.t) * 1e3


class _FakeAccel:
    """``torch.cuda``'s surface as the bench uses it, over host memory."""

    Event = _Event

    def __init__(self, count: int) -> None:
        self._count, self._reset = count, False

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return self._count

    def set_device(self, device: torch.device) -> None:
        assert isinstance(device, torch.device)

    def synchronize(self) -> None:
        pass

    def reset_peak_memory_stats(self) -> None:
        _STATE["reset"] = True

    def memory_allocated(self) -> int:
        return FAKE_BASE

    def max_memory_allocated(self) -> int:
        assert _STATE.get("reset"), "peak read without reset_peak_memory_stats"
        return FAKE_PEAK


_STATE: dict[str, bool] = {}  # per process: the spawned ranks each have their own


@dataclass(frozen=True)
class FakeCuda(BenchDevice):
    """A "cuda" BenchDevice whose ranks hold host tensors (pickled by reference into spawned ranks)."""

    type: str = "cuda"
    backend: str = "nccl"
    n: int = 1

    def accel(self) -> _FakeAccel:
        return _FakeAccel(self.n)

    def torch_device(self, local_rank: int) -> torch.device:
        return torch.device("cpu")


def _cli_main(capsys, *args: str) -> tuple[int, str]:
    from rlctl.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", "reshard", *args])
    return exc.value.code, capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA")
def test_device_cuda_without_cuda_is_one_line_exit_2(capsys) -> None:
    code, err = _cli_main(capsys, "--device", "cuda", "--models", "tiny", "--pairs", "1:1")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--device cuda" in lines[0] and "no cuda device" in lines[0], err


def test_unknown_device_is_one_line_exit_2(capsys) -> None:
    code, err = _cli_main(capsys, "--device", "tpu", "--models", "tiny")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "--device" in err and "'tpu'" in err, err


def test_host_device_and_skip_rules() -> None:
    host = resolve_device("cpu")
    assert (host.type, host.backend, host.count()) == ("cpu", "gloo", None)
    assert skip_reason(host, 4, 2) is None and skip_reason(host, 2, 4) is None  # gloo: any rank count
    one = FakeCuda(n=1)
    assert skip_reason(one, 1, 1) is None
    assert "needs 2 cuda devices" in skip_reason(one, 2, 2) and "1 visible" in skip_reason(one, 2, 2)
    four = FakeCuda(n=4)
    assert skip_reason(four, 4, 2) is None
    assert "q > p" in skip_reason(four, 2, 4)  # executor stages host buffers on shard-less ranks


def test_all_cases_skipped_is_refused_naming_the_option(monkeypatch, capsys) -> None:
    import rlctl.bench.reshard as mod

    monkeypatch.setattr(mod, "resolve_device", lambda name: FakeCuda(n=1))
    code, err = _cli_main(capsys, "--device", "cuda", "--models", "tiny", "--pairs", "2:2,4:2", "--json")
    assert code == 2
    assert "skipped tiny p=2 q=2 on cuda: needs 2 cuda devices" in err
    assert err.strip().splitlines()[-1].startswith("rlctl: error: --device cuda: none of the asked cases")


@pytest.mark.timeout(240)
def test_device_single_rank_rows_via_cli(monkeypatch) -> None:
    """Single-process rows run on the device path: allocator peak, device copy bandwidth, where."""
    import rlctl.bench.reshard as mod
    from rlctl.cli.bench_reshard import command

    monkeypatch.setattr(mod, "resolve_device", lambda name: FakeCuda(n=1))
    result = CliRunner().invoke(
        command, ["--json", "--device", "cuda", "--models", "tiny", "--pairs", "1:1,2:2", "--repeat", "1"]
    )
    assert result.exit_code == 0, result.output
    assert "skipped tiny p=2 q=2 on cuda" in result.stderr
    rows = json.loads(result.stdout)
    assert [(r["p"], r["q"], r["strategy"]) for r in rows] == [(1, 1, s) for s in ("planned", "disk")]
    for r in rows:
        assert (r["device"], r["backend"]) == ("cuda", "nccl")
        assert r["peak_extra_mb"] == 5.0  # max_memory_allocated above the ready state, not RSS
        assert r["memcpy_gbps"] > 0 and r["frac_memcpy"] == pytest.approx(r["gbps"] / r["memcpy_gbps"])
        assert r["match"] is True


@pytest.mark.timeout(240)
def test_device_two_ranks_run_through_the_device_path() -> None:
    """Two ranks, each bound to its own (fake) device, synchronised around the timed region."""
    skipped: list[str] = []
    rows = bench(
        ["tiny"],
        [(2, 2), (4, 2)],
        repeat=1,
        strategies=("planned", "verl", "disk"),  # verl is host-only: left out on a device
        device=FakeCuda(backend="gloo", n=2),
        on_skip=lambda case, reason: skipped.append(case),
    )
    assert skipped == ["tiny p=4 q=2"]
    got = rows_json(rows)
    assert [(r["p"], r["q"], r["strategy"]) for r in got] == [(2, 2, "planned"), (2, 2, "disk")]
    for r in got:
        assert (r["device"], r["backend"]) == ("cuda", "gloo")
        assert r["peak_extra_mb"] == 5.0 and r["frac_memcpy"] is None and r["match"] is True
