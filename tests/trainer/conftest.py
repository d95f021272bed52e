"""A tiny, fast RL profile on the built-in 1M-parameter model, for end-to-end trainer tests."""

from __future__ import annotations

from pathlib import Path

import pytest

TINY_RL = """
[run]
name = "{name}"
seed = 3
output_dir = "{out}"
[platform]
vendor = "{vendor}"
[cluster]
backend = "{backend}"
[model]
path = "{model}"
[data]
train = "builtin:addition"
val_size = 16
[algorithm]
preset = "{preset}"
[actor]
lr = 1e-4
micro_batch_sequences = 8
use_kl_loss = {kl}{actor}
[rollout]
engine = "hf"  # the same engine on every device (auto would refuse on a GPU without vLLM)
n = 4
max_new_tokens = 4
[trainer]
steps = {steps}
prompts_per_step = 4
val_every = 2
save_every = 2
keep_checkpoints = 2
loggers = ["jsonl"]
"""


# the platform whose device_type is the test device (see rlctl/platforms); used by ``write_profile``
VENDOR_OF_DEVICE = {"cpu": "cpu", "cuda": "nvidia"}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    from rlctl.models import build_tiny_model

    out = tmp_path_factory.mktemp("tiny") / "tiny-1m"
    build_tiny_model("tiny-1m", out, seed=0)
    return str(out)


@pytest.fixture
def write_profile(tmp_path: Path, tiny_model: str):
    def write(
        name: str = "t",
        backend: str = "inprocess",
        preset: str = "grpo",
        steps: int = 4,
        kl: bool = False,
        extra: str = "",
        device: str = "cpu",
        entropy_coeff: float = 0.0,
    ) -> Path:
        """``entropy_coeff`` > 0: an entropy bonus, which moves every weight even while all
        rewards are still 0 (zero advantages), so each sync has new weights to check."""
        text = TINY_RL.format(
            name=name,
            vendor=VENDOR_OF_DEVICE[device],
            out=tmp_path / "runs",
            backend=backend,
            model=tiny_model,
            preset=preset,
            steps=steps,
            kl=str(kl).lower(),
            actor=f"\nentropy_coeff = {entropy_coeff}" if entropy_coeff else "",
        )
        path = tmp_path / f"{name}.toml"
        path.write_text(text + extra)
        return path

    return write


@pytest.fixture
def rollout_engine_class(monkeypatch):
    """``install(cls)``: every rollout engine the run builds (colocated and the rollout workers')
    is ``cls``; the other engines are the registry's."""
    import rlctl.trainer.workers.rollout_engines as rollout_engines
    from rlctl.engines.registry import get_engine

    def install(cls) -> None:
        def engines(kind, model_type, backend, device="cpu", vendor=None):
            return cls if kind == "rollout" else get_engine(kind, model_type, backend, device, vendor)

        monkeypatch.setattr(rollout_engines, "get_engine", engines)

    return install
