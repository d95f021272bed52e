"""Hypothesis strategies for DataProtos (shared by the dispatch tests)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

from rlctl.dispatch import DataProto


@st.composite
def data_protos(draw, min_rows: int = 0, max_rows: int = 23, with_non_tensor: bool = True) -> DataProto:
    n = draw(st.integers(min_rows, max_rows))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    batch = {"ids": torch.randint(0, 100, (n, draw(st.integers(1, 4))), generator=g)}
    if draw(st.booleans()):
        batch["logp"] = torch.randn(n, generator=g)
    if draw(st.booleans()):
        batch["mask"] = torch.rand(n, 3, generator=g) > 0.5
    if draw(st.booleans()):
        batch["strided"] = torch.randn(2, n, generator=g).T  # a non-contiguous column
    if draw(st.booleans()):
        batch["bf"] = torch.randn(n, 2, generator=g).to(torch.bfloat16)
    non_tensor = {}
    if with_non_tensor and draw(st.booleans()):
        non_tensor["text"] = np.array([f"s{seed}-{i}" for i in range(n)], dtype=object)
    meta = {"temperature": draw(st.sampled_from([0.7, 1.0]))}
    return DataProto(batch, non_tensor, meta)
