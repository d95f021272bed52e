"""``rlctl bench parity`` on this CPU: float32 passes against float64, bfloat16 reports its real
(larger) errors and a verdict, a planted wrong kernel (a perturbed attention; a stale copy of one
layer in the rollout engine) FAILs naming the quantity, and two reports go side by side."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from rlctl.bench import parity as parity_mod
from rlctl.bench.parity import ParitySettings, run_case
from rlctl.bench.parity_env import REPO, ParityCase, resolve_case
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.engines.registry import get_engine
from tests.cli_runner import run_cli

TINY_PROFILE = REPO / "profiles" / "tiny-cpu.toml"
SMALL = ParitySettings(dtypes=("float32",), batch=2, prompt_len=8, response_len=12)
TRAIN_SIDE = ("train_log_probs", "train_entropy", "loss", "grad_norms", "optimizer_step")


@pytest.fixture(scope="module")
def tiny_case() -> ParityCase:
    return resolve_case(TINY_PROFILE)


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("parity")
    code, stdout, err = run_cli(
        "bench", "parity", str(TINY_PROFILE), "--json", "--dtypes", "float32,bfloat16",
        "--batch", "2", "--response-len", "16", "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(stdout)
    report["path"] = out / "report.json"
    report["path"].write_text(stdout)
    return report


def _by_dtype(case: dict) -> dict[str, dict]:
    return {r["dtype"]: r for r in case["results"]}


def test_tiny_float32_passes_and_bfloat16_reports_larger_errors(tiny_report):
    (case,) = tiny_report["cases"]
    assert case["case"]["device"] == "cpu" and case["case"]["rollout_engine"] == "hf"
    env = case["environment"]
    assert env["device_name"] and {"torch", "transformers"} <= set(env["libraries"])
    results = _by_dtype(case)
    fp32, bf16 = results["float32"], results["bfloat16"]
    assert fp32["verdict"] == "PASS", fp32
    assert all(q["verdict"] == "PASS" for q in fp32["quantities"].values())
    assert bf16["verdict"] in ("PASS", "WARN", "FAIL")
    for key in ("train_log_probs", "rollout_log_probs", "train_entropy"):
        f, b = fp32["quantities"][key], bf16["quantities"][key]
        assert 0 < f["mean_abs"] < 1e-4 and b["mean_abs"] > 100 * f["mean_abs"], key
        assert b["tolerance"]["passes"] > 100 * f["tolerance"]["passes"]  # stated per dtype
        assert "bfloat16" in b["tolerance"]["why"] and "float32" in f["tolerance"]["why"]
    gap = bf16["quantities"]["train_vs_rollout_gap"]
    assert 0 < gap["mean"] <= gap["p99"] <= gap["max"]
    layers = fp32["quantities"]["grad_norms"]["per_layer"]
    assert {"layer 0", "layer 3", "embed_tokens"} <= set(layers)
    assert fp32["quantities"]["optimizer_step"]["n"] > 100_000  # every parameter's step compared
    assert Path(tiny_report["histogram"]).is_file()
    assert fp32["kernels"]["train_attention"] == case["case"]["attn_implementation"]


def test_compare_puts_two_reports_side_by_side(tiny_report, tmp_path):
    path = tiny_report["path"]
    code, stdout, err = run_cli("bench", "parity", "--compare", str(path), str(path), "--json")
    assert code == 0, err
    rows = json.loads(stdout)["rows"]
    assert {r["dtype"] for r in rows} == {"float32", "bfloat16"}
    row = next(r for r in rows if r["dtype"] == "float32" and r["quantity"] == "train_log_probs")
    assert row["a"] == row["b"] > 0 and row["a_verdict"] == "PASS"
    bad = tmp_path / "bad.json"
    bad.write_text('{"x": 1}')
    code, _, err = run_cli("bench", "parity", "--compare", str(path), str(bad))
    assert code == 2 and str(bad) in err and "Traceback" not in err


def _perturbed_sdpa(module, query, key, value, attention_mask, **kwargs):
    """A wrong attention kernel: SDPA whose output is off by 1% (a bad tile, a wrong scale)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return out * 1.01, weights


def test_perturbed_attention_kernel_fails_naming_the_quantities(tiny_case):
    from transformers import AttentionInterface

    AttentionInterface.register("rlctl_test_perturbed", _perturbed_sdpa)
    perturbed = "rlctl_test_perturbed"
    case = ParityCase(
        **{
            **tiny_case.to_dict(),
            "attn_implementation": perturbed,
            "rollout_kwargs": {"attn_implementation": perturbed},
        }
    )
    (result,) = run_case(case, SMALL)["results"]
    assert result["verdict"] == "FAIL"
    assert {"train_log_probs", "rollout_log_probs"} <= set(result["failing"])
    assert (
        result["quantities"]["train_log_probs"]["mean_abs"]
        > result["quantities"]["train_log_probs"]["tolerance"]["warns"]
    )


class StaleLayerRollout(HFRolloutEngine):
    """A rollout engine computing layer 2 with a stale copy (weights 1% off the ones it loaded)."""

    computes_with_stored_weights = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        layer = self.model.model.layers[2]
        stale = copy.deepcopy(layer)
        with torch.no_grad():
            for p in stale.parameters():
                p.mul_(0.99)
        layer.forward = stale.forward


def test_stale_layer_in_the_rollout_engine_fails_only_the_rollout_side(tiny_case, monkeypatch):
    import rlctl.engines.registry as registry

    def engines(kind, model_type, backend, device="cpu", vendor=None):
        return (
            StaleLayerRollout if kind == "rollout" else get_engine(kind, model_type, backend, device, vendor)
        )

    monkeypatch.setattr(registry, "get_engine", engines)
    (result,) = run_case(tiny_case, SMALL)["results"]
    assert result["verdict"] == "FAIL"
    assert set(result["failing"]) == {"rollout_log_probs", "train_vs_rollout_gap"}, result["failing"]
    assert all(result["quantities"][k]["verdict"] == "PASS" for k in TRAIN_SIDE)
    assert result["kernels"]["rollout_engine"] == "StaleLayerRollout"
    assert tuple(result["quantities"]) == parity_mod.QUANTITIES


def test_bad_dtype_and_missing_model_are_one_line_errors(tmp_path):
    code, _, err = run_cli("bench", "parity", str(TINY_PROFILE), "--dtypes", "float8")
    assert code == 2 and "--dtypes" in err and "float8" in err and "Traceback" not in err
    profile = tmp_path / "p.toml"
    profile.write_text(
        TINY_PROFILE.read_text().replace("assets/tiny-1m-addition-sft", str(tmp_path / "none"))
    )
    code, _, err = run_cli("bench", "parity", str(profile))
    assert code == 2 and "model.path" in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_smollm2_float32_passes_and_bfloat16_reports(smollm2_dir, tmp_path):
    """The real pretrained model (30 layers, 49k vocabulary) on this CPU."""
    profile = tmp_path / "smol.toml"
    text = (REPO / "profiles" / "smollm2-cpu.toml").read_text()
    profile.write_text(text.replace('path = "assets/smollm2-135m-instruct"', f'path = "{smollm2_dir}"'))
    code, stdout, err = run_cli(
        "bench", "parity", str(profile), "--json", "--batch", "1", "--response-len", "12",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert code in (0, 1), err
    results = _by_dtype(json.loads(stdout)["cases"][0])
    assert results["float32"]["verdict"] == "PASS", results["float32"]
    bf16 = results["bfloat16"]["quantities"]["train_log_probs"]
    assert bf16["mean_abs"] > 100 * results["float32"]["quantities"]["train_log_probs"]["mean_abs"]
