"""Shared test setup: offline hub, bounded hypothesis, one Ray session per test process."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci",
        max_examples=40,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # pragma: no cover
    pass


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray cluster for the whole test process (small object store, no dashboard)."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(
            num_cpus=8,
            object_store_memory=300 * 1024 * 1024,
            include_dashboard=False,
            log_to_driver=True,
            configure_logging=False,
        )
    yield ray
    ray.shutdown()
