from __future__ import annotations

import pytest

from tests.agents.helpers import THINK_TEMPLATE, make_char_model


@pytest.fixture(scope="session")
def char_model(tmp_path_factory):
    return make_char_model(tmp_path_factory.mktemp("agents") / "plain")


@pytest.fixture(scope="session")
def think_model(tmp_path_factory):
    return make_char_model(tmp_path_factory.mktemp("agents") / "think", THINK_TEMPLATE)
