"""DataProto: chunk/concat/pad laws, union/select laws, repeat, indexing, pickling."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlctl.dispatch import DataProto
from tests.dispatch.strategies import data_protos


@given(data_protos(), st.integers(1, 9))
def test_concat_of_chunks_of_padded_is_identity(x, n):
    padded, pad = x.pad_to_divisor(n) if len(x) else (x, 0)
    assert len(padded) % n == 0 and 0 <= pad < n
    parts = padded.chunk(n)
    assert len(parts) == n and len({len(p) for p in parts}) == 1
    assert DataProto.concat(parts).unpad(pad).equals(x)


@given(data_protos(min_rows=1), st.integers(2, 9))
def test_chunk_rejects_non_divisible_sizes_with_a_hint(x, n):
    if len(x) % n == 0:
        assert DataProto.concat(x.chunk(n)).equals(x)
    else:
        with pytest.raises(ValueError, match="pad_to_divisor"):
            x.chunk(n)


@given(data_protos(min_rows=1), st.integers(1, 9))
def test_padding_repeats_real_rows(x, n):
    padded, pad = x.pad_to_divisor(n)
    for i in range(pad):
        assert padded[len(x) + i].equals(x[i % len(x)])


@given(data_protos())
def test_select_then_union_restores_the_whole(x):
    keys = sorted(x.batch)
    left, right = keys[: len(keys) // 2], keys[len(keys) // 2 :]
    a = x.select(left, list(x.non_tensor))
    b = x.select(right, [])
    assert a.union(b).equals(x)
    assert b.union(a).equals(x)  # union is commutative when there is no conflict
    assert x.union(x).equals(x)  # and idempotent
    assert x.select().equals(x)


@given(data_protos(min_rows=1))
def test_union_conflict_raises(x):
    key = next(iter(x.batch))
    other = x.select([key], [])
    other.batch[key] = other.batch[key].clone()
    flat = other.batch[key].view(-1)
    flat[0] = ~flat[0] if flat.dtype == torch.bool else flat[0] + 1
    with pytest.raises(ValueError, match=f"union conflict: tensor '{key}'"):
        x.union(other)


def test_union_non_tensor_and_meta_conflicts():
    a = DataProto.from_dict({"x": [1, 2]}, {"s": ["a", "b"]}, {"t": 1})
    with pytest.raises(ValueError, match="non-tensor column 's'"):
        a.union(DataProto.from_dict({}, {"s": ["a", "c"]}))
    with pytest.raises(ValueError, match="meta 't'"):
        a.union(DataProto.from_dict({"x": [1, 2]}, meta={"t": 2}))
    with pytest.raises(ValueError, match="rows"):
        a.union(DataProto.from_dict({"y": [1, 2, 3]}))


@given(data_protos(min_rows=1), st.integers(1, 4))
def test_repeat_interleave_keeps_copies_adjacent(x, k):
    r = x.repeat(k, interleave=True)
    assert len(r) == k * len(x)
    for i in range(len(x)):
        for j in range(k):
            assert r[i * k + j].equals(x[i])
    t = x.repeat(k, interleave=False)
    for j in range(k):
        assert t[j * len(x) : (j + 1) * len(x)].equals(x)


@given(data_protos(min_rows=1), st.data())
def test_index_by_int_slice_tensor_and_mask_agree(x, data):
    n = len(x)
    idx = data.draw(st.lists(st.integers(0, n - 1), max_size=8))
    picked = x[torch.tensor(idx, dtype=torch.long)]
    assert len(picked) == len(idx)
    for pos, i in enumerate(idx):
        assert picked[pos].equals(x[i])
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    assert x[mask].equals(x[mask.nonzero().flatten()])
    assert x[-1].equals(x[n - 1 : n])
    assert x[np.int64(n - 1)].equals(x[n - 1 : n]) and x[torch.tensor(0)].equals(x[0:1])
    with pytest.raises(IndexError, match="out of range"):
        x[n]


@given(data_protos())
def test_pickle_round_trip(x):
    y = pickle.loads(pickle.dumps(x, protocol=5))
    assert y.equals(x)
    for k in x.batch:
        assert y.batch[k].dtype == x.batch[k].dtype


def test_pickling_a_slice_carries_only_its_rows():
    big = DataProto({"x": torch.zeros(100_000, 8)})
    part = big.chunk(10)[0]
    assert len(pickle.dumps(part)) < 0.15 * len(pickle.dumps(big))
    # unpickled tensors own writable memory, independent of the source
    y = pickle.loads(pickle.dumps(part, protocol=5))
    y.batch["x"].add_(1)
    assert big.batch["x"].sum() == 0


def test_construction_errors_name_the_column():
    with pytest.raises(ValueError, match="disagree"):
        DataProto({"a": torch.zeros(3), "b": torch.zeros(4)})
    with pytest.raises(TypeError, match=r"batch\['a'\]"):
        DataProto({"a": [1, 2]})
    with pytest.raises(ValueError, match="part 1"):
        DataProto.concat([DataProto.from_dict({"a": [1]}), DataProto.from_dict({"b": [1]})])


def test_from_dict_to_and_columns():
    d = DataProto.from_dict({"x": [[1, 2], [3, 4]]}, {"s": ["a", {"k": 1}]}, {"m": 1})
    assert len(d) == 2 and d["x"].shape == (2, 2) and d["s"][1] == {"k": 1}
    assert d.non_tensor["s"].dtype == object
    moved = d.to("cpu")
    assert moved.equals(d)
    popped = d.pop(["x"])
    assert "x" not in d and "x" in popped
    assert np.array_equal(d.non_tensor["s"], np.array(["a", {"k": 1}], dtype=object))


@given(data_protos(min_rows=1), st.integers(0, 5))
def test_padding_marks_accumulate_and_come_off_again(x, k):
    rows = min(k, len(x))
    marked = x.mark_padding(rows)
    assert marked.padding_mask().tolist() == [False] * (len(x) - rows) + [True] * rows
    assert not x.padding_mask().any() and len(x.padding_mask()) == len(x)
    again = marked[: len(x) - rows].mark_padding(0) if rows < len(x) else marked
    assert again.padding_mask().sum() == (0 if rows < len(x) else rows)
    assert marked.without_padding_column().equals(x)
    with pytest.raises(ValueError, match="mark_padding"):
        x.mark_padding(len(x) + 1)
