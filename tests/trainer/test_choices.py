"""platform.dtype / rollout.engine resolution and the keys only some engines read (driver side)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.errors import UserError
from rlctl.platforms.cpu import CpuPlatform
from rlctl.platforms.nvidia import NvidiaPlatform
from rlctl.profile.loader import load_profile
from rlctl.trainer.plan import choices
from rlctl.trainer.plan.specs import build_specs
from rlctl.trainer.setup.context import _check_rollout_log_probs
from tests.cli_runner import run_cli
from tests.platforms.fakes import FakePynvml, cpu_host, make_dist, nvidia_host


def _profile(tmp_path: Path, body: str = ""):
    (tmp_path / "model").mkdir(exist_ok=True)
    path = tmp_path / "p.toml"
    path.write_text(f'[model]\npath = "model"\n{body}\n')
    return load_profile(path)


def _nvidia(tmp_path: Path, cc=(9, 0), engines: tuple[str, ...] = ()) -> NvidiaPlatform:
    host = nvidia_host(tmp_path, FakePynvml(cc=cc))
    for name in engines:
        make_dist(tmp_path / "site", name, "0.11.0")
    return NvidiaPlatform(host)


def test_auto_dtype_follows_the_devices(tmp_path):
    prof = _profile(tmp_path)
    assert choices.compute_dtype(prof, CpuPlatform(cpu_host(tmp_path / "cpu"))) == "float32"
    assert choices.compute_dtype(prof, _nvidia(tmp_path / "h200", cc=(9, 0))) == "bfloat16"
    assert choices.compute_dtype(prof, _nvidia(tmp_path / "t4", cc=(7, 5))) == "float16"  # no bf16 on a T4


def test_explicit_dtype_the_devices_lack_names_the_key(tmp_path):
    prof = _profile(tmp_path, '[platform]\ndtype = "bfloat16"')
    with pytest.raises(UserError, match=r"platform\.dtype: bfloat16 is not supported .*float32, float16"):
        choices.compute_dtype(prof, _nvidia(tmp_path / "t4", cc=(7, 5)))


def test_auto_engine_is_the_platforms_choice_never_a_silent_hf(tmp_path):
    prof = _profile(tmp_path)
    assert choices.rollout_engine(prof, CpuPlatform(cpu_host(tmp_path / "cpu"))) == "hf"
    with pytest.raises(UserError, match=r"rollout\.engine: auto: .*vllm, sglang.*rollout\.engine = \"hf\""):
        choices.rollout_engine(prof, _nvidia(tmp_path / "bare"))
    assert choices.rollout_engine(prof, _nvidia(tmp_path / "sg", engines=("sglang",))) == "sglang"
    assert choices.rollout_engine(prof, _nvidia(tmp_path / "both", engines=("sglang", "vllm"))) == "vllm"


def test_explicit_engine_must_run_here_and_be_installed(tmp_path):
    vllm = _profile(tmp_path, '[rollout]\nengine = "vllm"')
    with pytest.raises(UserError, match=r"rollout\.engine: vllm does not run on the cpu platform"):
        choices.rollout_engine(vllm, CpuPlatform(cpu_host(tmp_path / "cpu")))
    with pytest.raises(UserError, match=r"rollout\.engine: vllm is not installed"):
        choices.rollout_engine(vllm, _nvidia(tmp_path / "bare"))
    hf = _profile(tmp_path, '[rollout]\nengine = "hf"')
    assert choices.rollout_engine(hf, _nvidia(tmp_path / "bare2")) == "hf"  # asked for explicitly


def test_memory_fraction_is_refused_where_nothing_reads_it(tmp_path):
    prof = _profile(tmp_path, "[rollout]\ngpu_memory_utilization = 0.7")
    with pytest.raises(UserError, match=r"rollout\.gpu_memory_utilization: set to 0\.7"):
        choices.check_engine_keys(prof, "hf")
    choices.check_engine_keys(prof, "vllm")


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ('[rollout]\ntensor_parallel = 2\n[trainer]\nmode = "async"\n', "trainer.mode"),
        ('[rollout]\ntensor_parallel = 2\n[agent]\nenv = "builtin:calculator"\n', "agent.env"),
        ('[rollout]\ntensor_parallel = 2\n[agent]\nopenai_agent = "agent.py"\n', "agent.openai_agent"),
    ],
)
def test_tensor_parallel_where_it_cannot_run_is_refused_naming_the_key(tmp_path, extra, key):
    (tmp_path / "model").mkdir()
    path = tmp_path / "p.toml"
    path.write_text('[model]\npath = "model"\n[cluster]\ndevices_per_node = 2\n' + extra)
    code, out, err = run_cli("profile", "check", str(path))
    assert code == 2
    assert f"{key}: rollout.tensor_parallel = 2: " in err
    assert "Traceback" not in err


def test_tensor_parallel_on_the_hf_engine_in_sync_mode_is_accepted(tmp_path):
    (tmp_path / "model").mkdir()
    path = tmp_path / "p.toml"
    path.write_text(
        '[model]\npath = "model"\n[cluster]\ndevices_per_node = 2\n[rollout]\ntensor_parallel = 2\n'
    )
    code, out, err = run_cli("profile", "check", str(path))
    assert code == 0, err


def test_low_precision_keeps_fp32_masters_for_trained_models(tmp_path):
    prof = _profile(tmp_path, '[algorithm]\npreset = "ppo"\n[actor]\nuse_kl_loss = true')
    specs = build_specs(
        prof, device_type="cuda", dtype="bfloat16", attn="sdpa", dist_backend="nccl", rollout_engine="vllm"
    )
    assert (specs.policy.engine.dtype, specs.policy.engine.mixed_precision) == ("float32", "bfloat16")
    assert (specs.critic.engine.dtype, specs.critic.engine.mixed_precision) == ("float32", "bfloat16")
    assert (specs.ref.engine.dtype, specs.ref.engine.mixed_precision) == ("bfloat16", None)
    assert (specs.policy.rollout.engine, specs.policy.rollout.dtype) == ("vllm", "bfloat16")
    cpu = build_specs(prof, device_type="cpu", dtype="float32", attn="sdpa", dist_backend="gloo")
    assert (cpu.policy.engine.dtype, cpu.policy.engine.mixed_precision) == ("float32", None)


class _Policy:
    def __init__(self, gap):
        self.gap, self.asked = gap, None

    def rollout_log_prob_gap(self, temperature, top_p, top_k):
        self.asked = (temperature, top_p, top_k)
        return self.gap


def test_rollout_correction_refused_on_inexact_rollout_log_probs(tmp_path):
    prof = _profile(tmp_path, '[algorithm]\nrollout_correction = "token"\n[rollout]\ntop_p = 0.9')
    policy = _Policy("vLLM 0.9 returns raw log-probs before temperature")
    with pytest.raises(UserError, match=r"algorithm\.rollout_correction: token needs .*vLLM 0\.9"):
        _check_rollout_log_probs(prof, policy)
    assert policy.asked == (1.0, 0.9, 0)
    _check_rollout_log_probs(prof, _Policy(None))
    off = _Policy("anything")
    _check_rollout_log_probs(_profile(tmp_path), off)
    assert off.asked is None  # not even asked when correction is off


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_tensor_parallel_on_vllm_and_sglang_in_sync_mode_is_accepted(tmp_path, engine):
    (tmp_path / "model").mkdir()
    path = tmp_path / "p.toml"
    path.write_text(
        f'[model]\npath = "model"\n[cluster]\ndevices_per_node = 2\n[rollout]\nengine = "{engine}"\ntensor_parallel = 2\n'
    )
    code, out, err = run_cli("profile", "check", str(path))
    assert code == 0, err


def test_an_sglang_replica_across_nodes_is_refused_naming_the_engine(tmp_path):
    (tmp_path / "model").mkdir()
    path = tmp_path / "p.toml"
    path.write_text(
        '[model]\npath = "model"\n[cluster]\nnodes = 2\ndevices_per_node = 2\n'
        '[rollout]\nengine = "sglang"\ntensor_parallel = 4\n'
    )
    code, out, err = run_cli("profile", "check", str(path))
    assert code == 2 and "Traceback" not in err
    assert "rollout.engine: rollout.tensor_parallel = 4: one SGLang engine drives its replica's 4 devices" in err
