"""Pure dispatch/collect: for every mode and any (dp, tp) mesh, dispatch then collect is the identity.

No processes: each rank's payload is run through ``execute_on_rank`` (what a host does), with an
identity worker function, then folded by the mode's collect function.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlctl.dispatch import DataProto, Dispatch, Execute, Mesh, register, register_dispatch_mode
from rlctl.dispatch.backend_inprocess import InProcessBackend
from rlctl.dispatch.backend_inprocess import fetch as inproc_fetch
from rlctl.dispatch.futures import CallInfo, DispatchFuture, resolve_arg, split_for_dp
from rlctl.dispatch.modes import get_mode, plan_call
from rlctl.dispatch.proto import PADDING
from tests.dispatch.strategies import data_protos

meshes = st.builds(
    lambda dp, tp, order: Mesh.of(dict([("dp", dp), ("tp", tp)][:: 1 if order else -1]), dp * tp),
    st.integers(1, 5),
    st.integers(1, 3),
    st.booleans(),
)


def run(mode_name, mesh, args, kwargs=None, fn=lambda *a, **k: a[0] if a else k, execute=None):
    """Dispatch, run ``fn`` on every rank that executes, collect: the whole round trip without workers."""
    mode = get_mode(mode_name)
    payloads, wanted = plan_call(mode, execute or mode.default_execute, mesh, args, kwargs or {})
    outputs = {r: execute_on(fn, *payloads[r]) for r in payloads}
    return mode.collect_fn(mesh, {r: outputs[r] for r in wanted}), payloads


def execute_on(fn, args, kwargs):
    from rlctl.dispatch.futures import execute_on_rank

    return execute_on_rank(fn, args, kwargs, inproc_fetch)


@given(data_protos(), meshes)
def test_dp_compute_proto_round_trip_is_identity(x, mesh):
    out, payloads = run(Dispatch.DP_COMPUTE_PROTO, mesh, (x,))
    assert out.equals(x)
    # every rank of one DP group got the same shard; shards of a DP group are equal in size
    for r, (args, _) in payloads.items():
        rep = mesh.rank_of({"dp": mesh.dp_rank(r)})
        assert args[0] is payloads[rep][0][0]
    assert len({len(a[0].data) for a, _ in payloads.values()}) == 1


@given(data_protos(), meshes, st.integers(1, 3))
def test_dp_outputs_with_k_rows_per_input_row_lose_exactly_the_padding(x, mesh, k):
    out, _ = run(Dispatch.DP_COMPUTE_PROTO, mesh, (x,), fn=lambda b: b.repeat(k))
    assert out.equals(x.repeat(k))


@given(data_protos(), meshes)
def test_dp_metrics_collects_one_output_per_dp_group(x, mesh):
    out, _ = run(Dispatch.DP_COMPUTE_METRICS, mesh, (x,))
    assert len(out) == mesh.dp_size
    assert DataProto.concat(out).equals(x)


@given(st.integers(-5, 5), meshes)
def test_one_to_all_gives_everyone_the_same(v, mesh):
    out, _ = run(Dispatch.ONE_TO_ALL, mesh, (v,))
    assert out == [v] * mesh.world_size


@given(st.data(), meshes)
def test_all_to_all_round_trip_is_identity(data, mesh):
    items = data.draw(st.lists(st.integers(), min_size=mesh.world_size, max_size=mesh.world_size))
    out, _ = run(Dispatch.ALL_TO_ALL, mesh, (items,))
    assert out == items
    with pytest.raises(ValueError, match="one per rank"):
        run(Dispatch.ALL_TO_ALL, mesh, (items + [0],))


@given(st.integers(), meshes)
def test_rank_zero_runs_only_rank_zero(v, mesh):
    out, payloads = run(Dispatch.RANK_ZERO, mesh, (v,))
    assert out == v and list(payloads) == [0]


@given(meshes)
def test_execute_rank_zero_with_one_to_all(mesh):
    out, payloads = run(Dispatch.ONE_TO_ALL, mesh, (1,), execute=Execute.RANK_ZERO)
    assert out == [1] and list(payloads) == [0]


def producer_future(x, mesh, with_sizes=True):
    """What a DP_COMPUTE_PROTO identity call on ``mesh`` leaves behind: per-rank outputs + sizes."""
    from rlctl.dispatch.backend_inprocess import _Result

    mode = get_mode(Dispatch.DP_COMPUTE_PROTO)
    payloads, wanted = plan_call(mode, Execute.ALL, mesh, (x,), {})
    outs = {r: execute_on(lambda b: b, *payloads[r]) for r in payloads}
    sizes = {r: _Result(len(o)) for r, o in outs.items()} if with_sizes else None
    parts = {r: _Result(o) for r, o in outs.items()}
    return DispatchFuture(
        CallInfo("a", "f"), parts, mode.collect_fn, wanted, mesh, InProcessBackend(), sizes=sizes
    )


@given(data_protos(), meshes, meshes, st.booleans())
def test_future_passed_to_next_call_is_resolved_on_the_ranks(x, mesh_a, mesh_b, with_sizes):
    """A producer's per-rank outputs, handed lazily to a consumer with another mesh, rebuild x."""
    fut = producer_future(x, mesh_a, with_sizes)
    out, payloads_b = run(Dispatch.DP_COMPUTE_PROTO, mesh_b, (fut,))
    assert out.equals(x)
    for r, (args, _) in payloads_b.items():  # each rank's chunk is exactly the eager split's
        got, pad = resolve_arg(args[0], inproc_fetch)
        want = split_for_dp(x, mesh_b.dp_size)[mesh_b.dp_rank(r)] if len(x) else None
        if want is not None:
            # the identity producer passes its input's padding marks through (all False once trimmed)
            assert not got.padding_mask().any()
            assert got.without_padding_column().equals(want.data) and pad == want.pad_rows
    whole, _ = run(Dispatch.ONE_TO_ALL, mesh_b, (fut,))
    assert all(w.equals(x) for w in whole)


def test_lazy_chunk_fetches_only_the_producer_outputs_it_needs():
    x = DataProto.from_dict({"x": list(range(8))})
    mesh = Mesh.of({"dp": 4}, 4)
    fut = producer_future(x, mesh)
    for d in range(4):
        fetched = []

        def recording_fetch(parts, fetched=fetched):
            fetched.append(sorted(parts))
            return inproc_fetch(parts)

        data, pad = resolve_arg(fut.lazy(("chunk", 4, d)), recording_fetch)
        assert data["x"].tolist() == [2 * d, 2 * d + 1] and pad == 0
        assert fetched == [[0, 1, 2, 3], [d]]  # the sizes, then one producer output


@given(data_protos(), st.integers(1, 6))
def test_split_for_dp_marks_only_trailing_rows_as_padding(x, n):
    if len(x) == 0:
        return
    shards = split_for_dp(x, n)
    total_pad = sum(s.pad_rows for s in shards)
    assert total_pad == (-len(x)) % n
    real = DataProto.concat([s.data[: len(s.data) - s.pad_rows] for s in shards])
    assert real.equals(x)


def test_dp_broadcasts_non_dataproto_args_and_checks_lengths():
    mesh = Mesh.of({"dp": 2}, 2)
    a, b = DataProto.from_dict({"x": [1, 2, 3]}), DataProto.from_dict({"y": [1, 2, 3]})
    out, _ = run(
        Dispatch.DP_COMPUTE_PROTO,
        mesh,
        (a, b),
        {"step": 7},
        fn=lambda p, q, step: p.union(q).union(DataProto.from_dict({"s": [step] * len(p)})),
    )
    assert out["s"].tolist() == [7, 7, 7] and out["y"].tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="same length"):
        run(Dispatch.DP_COMPUTE_PROTO, mesh, (a, DataProto.from_dict({"y": [1]})))


def test_dp_output_that_cannot_be_unpadded_is_a_clear_error():
    mesh = Mesh.of({"dp": 2}, 2)
    with pytest.raises(ValueError, match="whole multiple"):
        run(Dispatch.DP_COMPUTE_PROTO, mesh, (DataProto.from_dict({"x": [1, 2, 3]}),), fn=lambda b: b[:1])


def test_custom_mode_registration():
    def dispatch_reverse(mesh, args, kwargs):
        return [((list(reversed(args[0]))[r],), {}) for r in range(mesh.world_size)]

    def collect_sum(mesh, outputs):
        return sum(outputs.values())

    register_dispatch_mode("TEST_REVERSE_SUM", dispatch_reverse, collect_sum)
    with pytest.raises(ValueError, match="already registered"):
        register_dispatch_mode("TEST_REVERSE_SUM", dispatch_reverse, collect_sum)
    out, payloads = run("TEST_REVERSE_SUM", Mesh.of(None, 3), ([1, 2, 3],))
    assert out == 6 and payloads[0][0] == (3,)

    @register("TEST_REVERSE_SUM")
    def method(self, v):
        return v

    assert method.__rlctl_dispatch__.mode == "TEST_REVERSE_SUM"


def test_register_rejects_unknown_modes_and_a_timeout_parameter():
    with pytest.raises(KeyError, match="unknown dispatch mode"):
        register("NOPE")
    with pytest.raises(TypeError, match="timeout"):

        @register(Dispatch.ONE_TO_ALL)
        def m(self, timeout):
            return timeout


@given(meshes)
def test_mesh_coords_and_representatives(mesh):
    ranks = list(range(mesh.world_size))
    assert [mesh.rank_of(mesh.coords(r)) for r in ranks] == ranks
    reps = mesh.representatives()
    assert len(reps) == mesh.dp_size
    assert [mesh.dp_rank(r) for r in reps] == list(range(mesh.dp_size))
    assert all(v == 0 for r in reps for k, v in mesh.coords(r).items() if k != "dp")


def test_mesh_errors():
    with pytest.raises(ValueError, match="has 4 ranks but the resource pool has 2"):
        Mesh.of({"dp": 2, "tp": 2}, 2)
    with pytest.raises(ValueError, match="size < 1"):
        Mesh.of({"dp": 0}, 0)


@given(data_protos(min_rows=1), meshes)
def test_dp_padding_rows_are_marked_for_the_method_and_unmarked_in_the_result(x, mesh):
    seen = {}

    def method(b):
        seen[len(seen)] = b.padding_mask().clone()
        return b

    out, payloads = run(Dispatch.DP_COMPUTE_METRICS, mesh, (x,), fn=method)
    pads = [payloads[r][0][0].pad_rows for r in sorted(payloads)]
    for marks, pad in zip(seen.values(), pads, strict=True):
        assert marks.tolist() == [False] * (len(marks) - pad) + [True] * pad
    assert all(PADDING not in o.batch for o in out)
    proto, _ = run(Dispatch.DP_COMPUTE_PROTO, mesh, (x,))
    assert proto.equals(x)


def test_seven_rows_on_two_ranks_mark_the_copy_of_row_zero():
    x = DataProto.from_dict({"row": list(range(7))})
    _, payloads = run(Dispatch.DP_COMPUTE_METRICS, Mesh.of({"dp": 2}, 2), (x,))
    shards = [payloads[r][0][0].data for r in (0, 1)]
    assert shards[1]["row"].tolist() == [4, 5, 6, 0]
    assert shards[1].padding_mask().tolist() == [False, False, False, True]
    assert not shards[0].padding_mask().any()
