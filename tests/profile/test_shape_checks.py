"""Shape mistakes are one-line profile errors naming the keys, before any worker starts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.cli_runner import run_cli
from tests.profile.test_profile_errors import assert_user_error, write


def profile(tmp_path, *, tp: int = 1, devices: int = 1, backend: str = "ray", heads=(14, 2)) -> str:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(
        json.dumps({"model_type": "qwen2", "num_attention_heads": heads[0], "num_key_value_heads": heads[1]})
    )
    return write(
        tmp_path,
        f'[model]\npath = "{model}"\n[cluster]\nbackend = "{backend}"\ndevices_per_node = {devices}\n'
        f"[rollout]\ntensor_parallel = {tp}\n[trainer]\nprompts_per_step = 7\n",
    )


def test_batches_that_do_not_divide_the_ranks_are_fine(tmp_path):
    # 7 prompts x 8 samples over 2 ranks: the update pads each mini-batch with masked rows
    code, _, err = run_cli("profile", "check", profile(tmp_path, devices=2))
    assert code == 0, err


def tp_error(tmp_path, **kw) -> str:
    """The shape check's message for a tensor-parallel profile, exercised directly."""
    from rlctl.errors import UserError
    from rlctl.profile import load_profile
    from rlctl.profile.checks import _check_shapes

    path = profile(tmp_path, **kw)
    text = Path(path).read_text()
    Path(path).write_text(text.replace(f"tensor_parallel = {kw['tp']}", "tensor_parallel = 1"))
    p = load_profile(path)
    p.rollout = replace(p.rollout, tensor_parallel=kw["tp"])  # sections are frozen

    def fail(key: str, message: str) -> None:
        raise UserError(f"{key}: {message}")

    with pytest.raises(UserError) as err:
        _check_shapes(p, fail)
    return str(err.value)


def test_tensor_parallel_must_divide_the_attention_heads(tmp_path):
    msg = tp_error(tmp_path, tp=4, devices=4, heads=(14, 2))
    assert msg.startswith("rollout.tensor_parallel:") and "num_attention_heads (14)" in msg


def test_tensor_parallel_must_divide_the_kv_heads(tmp_path):
    msg = tp_error(tmp_path, tp=4, devices=4, heads=(12, 6))
    assert msg.startswith("rollout.tensor_parallel:") and "num_key_value_heads (6)" in msg
    # the HF engine shards whole KV heads: more TP ranks than KV heads cannot be replicated
    msg = tp_error(tmp_path, tp=4, devices=4, heads=(8, 2))
    assert "does not divide the model's num_key_value_heads (2)" in msg


def test_tensor_parallel_must_divide_the_world(tmp_path):
    msg = tp_error(tmp_path, tp=2, devices=3)
    assert msg.startswith("rollout.tensor_parallel:") and "3 ranks" in msg


def test_inprocess_backend_runs_one_rank(tmp_path):
    p = profile(tmp_path, devices=2, backend="inprocess")
    assert_user_error(["profile", "check", p], "cluster.backend", "2 ranks")
