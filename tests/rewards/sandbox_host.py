"""What this host's sandbox gives, and how tests treat a host that refuses ``strict``.

Locally, a host without every required layer skips (or asserts the refusal in) the tests that run
snippets. With ``RLCTL_TEST_REQUIRE_SANDBOX=1`` (set by ``.ci/run``) a refusal fails the test
instead: a hostile-snippet test that only saw a refusal has tested nothing.
"""

from __future__ import annotations

import os

import pytest

from rlctl.rewards.sandbox import sandbox_plan
from rlctl.rewards.sandbox_layers import refusal

PLAN = sandbox_plan()
REFUSED = refusal(PLAN, "strict")
REQUIRED = os.environ.get("RLCTL_TEST_REQUIRE_SANDBOX") == "1"


def refused_here() -> bool:
    """True where strict refuses and that is allowed; fails the test where it is not allowed."""
    if REFUSED is not None and REQUIRED:
        pytest.fail(f"RLCTL_TEST_REQUIRE_SANDBOX=1 but this host refuses strict code rewards: {REFUSED}")
    return REFUSED is not None


def require_strict() -> None:
    """Skip (or, where required, fail) a test that needs the strict sandbox to run snippets."""
    if refused_here():
        pytest.skip(f"this host refuses strict code rewards: {REFUSED}")
