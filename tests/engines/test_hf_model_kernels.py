"""Models load without transformers' Hub kernels: the platform picks kernels, and no load reaches a hub."""

from __future__ import annotations

import pytest
import transformers
from packaging.version import Version

from rlctl.engines.hf_model import load_causal_lm, load_value_model
from rlctl.platforms.hub_kernels import no_hub_kernels
from tests.engines.helpers import make_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("m") / "model", tie=False, seed=3)


def test_use_kernels_is_passed_only_where_transformers_takes_it():
    takes_it = Version(transformers.__version__) >= Version("4.53")
    assert no_hub_kernels() == ({"use_kernels": False} if takes_it else {})


def test_loaded_models_do_not_kernelize(model_dir):
    for model in (load_causal_lm(model_dir), load_value_model(model_dir).backbone):
        # transformers 5.x defaults this to True when the kernels package is installed
        assert getattr(model, "use_kernels", False) is False
