"""Delta weight pushes' encoding: a bf16 copy moved by an RL-sized step changes a few percent of its
elements and the delta carries just those; an fp32 copy goes whole; a wrong delta fails its read-back."""

from __future__ import annotations

import torch

from rlctl.engines.weight_delta import Tally, apply, diff, values_checksum, whole


def _adam_like_step(w: torch.Tensor, lr: float, seed: int = 0) -> torch.Tensor:
    """An update of about ``lr`` per element, as Adam makes (sign of a random gradient)."""
    g = torch.Generator().manual_seed(seed)
    return w - lr * torch.randn(w.shape, generator=g).sign()


def _weights(n: int = 1 << 18) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(1)) * 0.05


def test_bf16_copy_after_a_small_step_sends_only_changed_elements():
    w = _weights()
    held = w.to(torch.bfloat16)
    new = _adam_like_step(w, 1e-6).to(torch.bfloat16)
    d = diff("w", new, held)
    tally = Tally()
    tally.add(d)
    m = tally.metrics()
    changed = int((new.view(torch.int16) != held.view(torch.int16)).sum())
    assert d.changed == changed and 0 < m["sync/changed_frac"] < 0.05
    # ~2% changed, each one bit-pattern step away: int32 index + int8 step per element
    far = d.extra_index.numel()  # elements near zero, too many values away for an int8 step
    assert d.encoding == "index+steps" and far < 0.01 * changed
    assert m["sync/bytes"] == (changed - far) * 5 + far * 6
    assert m["sync/index_value_bytes"] == changed * 6 and m["sync/full_bytes"] == w.numel() * 2
    assert apply(held, d)
    assert torch.equal(held.view(torch.int16), new.view(torch.int16))


def test_denser_changes_go_as_a_bitmask_with_steps():
    w = _weights()
    held = w.to(torch.bfloat16)
    new = _adam_like_step(w, 2e-5).to(torch.bfloat16)  # ~20% of the elements change
    d = diff("w", new, held)
    assert d.encoding == "bitmask+steps"
    far = d.extra_index.numel()
    assert d.wire_bytes() == w.numel() // 8 + d.changed - far + 6 * far < 0.2 * w.numel() * 2
    assert apply(held, d) and torch.equal(held.view(torch.int16), new.view(torch.int16))


def test_changes_past_an_int8_step_send_values():
    held = torch.zeros(4096, dtype=torch.bfloat16)
    new = held.clone()
    new[::64] = 1.0  # 0 -> 1.0 is thousands of bit-pattern steps
    d = diff("w", new, held)
    assert d.encoding == "index+values" and not d.steps
    assert apply(held, d) and torch.equal(held, new)


def test_fp32_copy_changes_everywhere_and_goes_whole():
    w = _weights()
    d = diff("w", _adam_like_step(w, 2e-5), w.clone())
    assert d.encoding == "whole" and d.wire_bytes() == w.numel() * 4
    assert d.changed > 0.99 * w.numel()


def test_unchanged_tensor_sends_nothing():
    w = _weights(1000).to(torch.bfloat16)
    d = diff("w", w.clone(), w)
    assert d.changed == 0 and d.wire_bytes() == 0
    assert apply(w, d)


def test_a_wrong_value_or_position_fails_the_read_back():
    w = _weights()
    held = w.to(torch.bfloat16)
    new = _adam_like_step(w, 1e-6).to(torch.bfloat16)
    wrong_value = diff("w", new, held)
    wrong_value.values[3] += 1  # a corrupted element: the checksum was taken before
    assert not apply(held.clone(), wrong_value)
    moved = diff("w", new, held)
    moved.index = moved.index + 1  # every element one position off
    assert not apply(held.clone(), moved)
    lost = diff("w", new, held)
    lost.index, lost.values = lost.index[1:], lost.values[1:]  # one change dropped
    assert not apply(held.clone(), lost)
    other_base = diff("w", new, held)  # steps added to a copy that is not the sender's base
    assert not apply((held.float() + 1e-2).to(torch.bfloat16), other_base)


def test_whole_and_checksum():
    t = torch.arange(6.0).reshape(2, 3)
    d = whole("t", t)
    assert d.index is None and d.changed == 6 and d.check == values_checksum(t.reshape(-1))
    target = torch.zeros(2, 3)
    assert apply(target, d) and torch.equal(target, t)
    assert values_checksum(torch.tensor([1.0, 2.0])) != values_checksum(torch.tensor([2.0, 1.0]))
