"""Resolution order: explicit vendor, RLCTL_PLATFORM, one out-of-tree plugin, one built-in, CPU."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from rlctl.errors import UserError
from rlctl.platforms import known_platforms, resolve_platform
from rlctl.platforms.host import Host
from rlctl.platforms.smi import query_nvml
from tests.platforms.fakes import FakePynvml, cpu_host, nvidia_host, rocm_host, touch

GROUP = "rlctl.platforms"


def ep(name: str, attr: str) -> EntryPoint:
    return EntryPoint(name=name, value=f"tests.platforms.plugin_fixture:{attr}", group=GROUP)


def test_fallback_is_cpu_with_every_probe_reason(tmp_path):
    p = resolve_platform(env={}, host=cpu_host(tmp_path), entry_points=[])
    assert p.name == "cpu"
    res = p.resolution
    assert res.tier == "fallback" and res.reason.startswith("chosen because")
    assert set(res.probes) == {"nvidia", "rocm", "ascend", "cpu"}
    assert res.probes["nvidia"].reason.startswith("no NVIDIA driver")


def test_builtin_nvidia_detected(tmp_path):
    p = resolve_platform(env={}, host=nvidia_host(tmp_path), entry_points=[])
    assert p.name == "nvidia" and p.resolution.tier == "builtin"
    assert "NVIDIA H200" in p.resolution.reason


def test_builtin_rocm_detected(tmp_path):
    p = resolve_platform(env={}, host=rocm_host(tmp_path), entry_points=[])
    assert p.name == "rocm" and "gfx942" in p.resolution.reason


def test_two_builtins_matching_is_an_error_listing_both(tmp_path):
    host = rocm_host(tmp_path)
    touch(host.root, "/dev/nvidia0")
    touch(host.root, "/sys/module/nvidia/version", "570.124.06")
    rocm_smi = host.smi
    host.smi = lambda v: query_nvml(FakePynvml()) if v == "nvidia" else rocm_smi(v)
    with pytest.raises(UserError) as err:
        resolve_platform(env={}, host=host, entry_points=[])
    msg = str(err.value)
    assert "nvidia: NVML" in msg and "rocm: amdgpu live" in msg and "RLCTL_PLATFORM" in msg


def test_explicit_vendor_beats_env_and_probes(tmp_path):
    host = nvidia_host(tmp_path)
    p = resolve_platform("cpu", env={"RLCTL_PLATFORM": "rocm"}, host=host, entry_points=[])
    assert p.name == "cpu" and p.resolution.tier == "explicit"
    assert "platform.vendor" in p.resolution.reason


def test_env_beats_probes_and_aliases_work(tmp_path):
    p = resolve_platform(env={"RLCTL_PLATFORM": "cuda"}, host=cpu_host(tmp_path), entry_points=[])
    assert p.name == "nvidia" and p.resolution.tier == "env"
    assert not p.probe().found  # chosen, but doctor will FAIL it
    p = resolve_platform(env={"RLCTL_PLATFORM": "auto"}, host=cpu_host(tmp_path), entry_points=[])
    assert p.name == "cpu"


def test_unknown_vendor_lists_known_names(tmp_path):
    with pytest.raises(UserError) as err:
        resolve_platform(
            env={"RLCTL_PLATFORM": "bogus"},
            host=cpu_host(tmp_path),
            entry_points=[ep("acme", "AcmePlatform")],
        )
    msg = str(err.value)
    assert "RLCTL_PLATFORM" in msg and "'bogus'" in msg
    for name in ("cpu", "nvidia", "rocm", "ascend", "acme"):
        assert name in msg
    assert err.value.exit_code == 2


def test_one_matching_plugin_wins_over_builtins(tmp_path):
    host = nvidia_host(tmp_path, env={"ACME_DEVICES": "4"})
    p = resolve_platform(env={}, host=host, entry_points=[ep("acme", "AcmePlatform")])
    assert p.name == "acme" and p.resolution.tier == "plugin"
    assert "ACME_DEVICES=4" in p.resolution.reason
    assert p.device_count() == 4


def test_plugin_that_does_not_match_falls_through(tmp_path):
    p = resolve_platform(env={}, host=cpu_host(tmp_path), entry_points=[ep("acme", "AcmePlatform")])
    assert p.name == "cpu"
    assert p.resolution.probes["plugin:acme"].reason == "ACME_DEVICES is not set"


def test_two_matching_plugins_is_an_error(tmp_path):
    host = cpu_host(tmp_path, env={"ACME_DEVICES": "1"})
    with pytest.raises(UserError) as err:
        resolve_platform(
            env={}, host=host, entry_points=[ep("acme", "AcmePlatform"), ep("zeta", "ZetaPlatform")]
        )
    assert "acme: ACME_DEVICES=1" in str(err.value) and "zeta: zeta always matches" in str(err.value)


def test_broken_plugins_are_kept_as_reasons_not_raised(tmp_path):
    eps = [
        ep("bad", "broken_factory"),
        ep("odd", "not_a_platform"),
        EntryPoint("gone", "no_such_mod:X", GROUP),
    ]
    p = resolve_platform(env={}, host=cpu_host(tmp_path), entry_points=eps)
    assert p.name == "cpu"
    errs = p.resolution.plugin_errors
    assert "vendor SDK missing" in errs["bad"]
    assert "not a rlctl Platform" in errs["odd"]
    assert "ModuleNotFoundError" in errs["gone"]


def test_explicit_plugin_by_name_and_broken_explicit_plugin(tmp_path):
    host = cpu_host(tmp_path)
    p = resolve_platform("acme", env={}, host=host, entry_points=[ep("acme", "AcmePlatform")])
    assert p.name == "acme" and p.resolution.tier == "explicit"
    with pytest.raises(UserError, match="vendor SDK missing"):
        resolve_platform("bad", env={}, host=host, entry_points=[ep("bad", "broken_factory")])


def test_known_platforms_includes_plugins():
    assert known_platforms([ep("acme", "AcmePlatform")]) == ["acme", "ascend", "cpu", "nvidia", "rocm"]


def test_default_host_uses_given_env(tmp_path):
    p = resolve_platform(env={"RLCTL_PLATFORM": "ascend"}, entry_points=[])
    assert p.name == "ascend" and isinstance(p.host, Host)
    assert p.host.env == {"RLCTL_PLATFORM": "ascend"}
