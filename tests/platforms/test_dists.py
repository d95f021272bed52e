"""Reading installed distributions and torch's build flavour without importing anything."""

from __future__ import annotations

import sys

from hypothesis import given
from hypothesis import strategies as st

from rlctl.platforms.dists import DistIndex, normalize, parse_torch_version_py, torch_build
from tests.platforms.fakes import make_dist, make_torch


def test_torch_flavours_from_version_py(tmp_path):
    make_torch(tmp_path / "a", "2.7.1+cu128", cuda="12.8")
    tb = torch_build(DistIndex([str(tmp_path / "a")]))
    assert (tb.flavour, tb.cuda, tb.cuda_major, tb.base_version) == ("cuda", "12.8", 12, "2.7.1")
    make_torch(tmp_path / "b", "2.7.1+rocm6.3", hip="6.3.42131")
    tb = torch_build(DistIndex([str(tmp_path / "b")]))
    assert (tb.flavour, tb.hip) == ("rocm", "6.3.42131")
    make_torch(tmp_path / "c", "2.7.1")
    assert torch_build(DistIndex([str(tmp_path / "c")])).flavour == "cpu"
    assert torch_build(DistIndex([str(tmp_path / "none")])).flavour == "none"


def test_local_tag_fallback_without_version_py(tmp_path):
    make_dist(tmp_path, "torch", "2.6.0+cu124")
    tb = torch_build(DistIndex([str(tmp_path)]))
    assert (tb.flavour, tb.cuda) == ("cuda", "12.4")
    assert "local version tag" in tb.source


def test_real_torch_here_is_cpu_and_not_imported():
    had = "torch" in sys.modules
    tb = torch_build(DistIndex())
    assert tb.flavour == "cpu" and tb.version.endswith("+cpu") and tb.source.endswith("version.py")
    assert ("torch" in sys.modules) == had


def test_first_on_path_wins_and_requirements(tmp_path):
    make_dist(tmp_path / "first", "vllm", "0.7.3", requires=("torch==2.5.1", 'pytest; extra == "test"'))
    make_dist(tmp_path / "second", "vllm", "0.9.0")
    idx = DistIndex([str(tmp_path / "first"), str(tmp_path / "second")])
    d = idx.get("VLLM")
    assert d.version == "0.7.3"
    assert [str(r) for r in d.requirements()] == ["torch==2.5.1"]
    assert d.extras() == ["test"]
    assert str(d.requirement_on("torch").specifier) == "==2.5.1"
    assert d.requirement_on("pytest") is None and d.requirement_on("pytest", any_extra=True) is not None


def test_version_py_parse_handles_both_assignment_styles():
    text = "cuda: Optional[str] = '12.8'\nhip = None\nx = f(1)\n"
    assert parse_torch_version_py(text) == {"cuda": "12.8", "hip": None}
    assert parse_torch_version_py("def (:") == {}


@given(st.text(alphabet="abcXYZ019-_.", min_size=1, max_size=20))
def test_normalize_is_idempotent_and_separator_blind(name):
    n = normalize(name)
    assert normalize(n) == n
    assert normalize(name.replace("_", "-").replace(".", "-")) == n
    assert n == n.lower()
