"""A new vendor is its platform file and its pin data (docs/platforms.md, "Adding a vendor"):
``tests/platforms/toy_vendor/`` holds exactly those two, loaded as an out-of-tree plugin, and
resolution, the plan, doctor and the workers' device selection follow it with no other change."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from rlctl.dispatch import Dispatch, ResourcePool, Worker, register, spawn_colocated
from rlctl.errors import UserError
from rlctl.platforms import ENTRY_POINT_GROUP, Host, resolve_platform
from rlctl.profile import load_profile

REPO = Path(__file__).resolve().parents[2]
TOY = EntryPoint(name="toy", value="tests.platforms.toy_vendor.toy:ToyPlatform", group=ENTRY_POINT_GROUP)


def toy(env: dict[str, str]):
    return resolve_platform(env=env, host=Host(env=env), entry_points=[TOY])


def test_the_vendor_is_two_files():
    files = sorted(
        p.name for p in (REPO / "tests/platforms/toy_vendor").iterdir() if p.suffix in (".py", ".toml")
    )
    assert files == ["__init__.py", "toy.py", "toy_pins.toml"]  # __init__ only makes it importable


def test_resolution_and_its_pin_data():
    p = toy({"TOY_DEVICES": "2", "TOY_QUEUE_DEPTH": "4"})
    assert (p.name, p.resolution.tier, p.device_count()) == ("toy", "plugin", 2)
    spec = p.runtime_spec()
    assert (spec.device_type, spec.dist_backend, spec.ray_resource, spec.visible_devices_env) == (
        "cpu",
        "gloo",
        "TOYPU",
        "TOY_VISIBLE_DEVICES",
    )
    assert [pin.id for pin in p.pins if pin.platforms == ("toy",)] == ["toy-queue-depth"]


def test_plan_holds_the_run_to_the_vendors_pins():
    from rlctl.trainer.plan.run_plan import refuse_failures, resolve_plan

    plan = resolve_plan(
        load_profile(str(REPO / "profiles/tiny-cpu.toml")),
        platform=toy({"TOY_DEVICES": "1", "TOY_QUEUE_DEPTH": "4"}),
    )
    assert (plan.platform, plan.ray_resource, plan.dist_backend, plan.device_type) == (
        "toy",
        "TOYPU",
        "gloo",
        "cpu",
    )
    pin = {c.name: c for c in plan.checks}["pin toy-queue-depth"]
    assert pin.verdict == "FAIL" and pin.fix == "unset TOY_QUEUE_DEPTH (or set it to 1)"
    with pytest.raises(UserError, match="pin toy-queue-depth"):
        refuse_failures(plan)
    clean = resolve_plan(
        load_profile(str(REPO / "profiles/tiny-cpu.toml")), platform=toy({"TOY_DEVICES": "1"})
    )
    assert "pin toy-queue-depth" not in {c.name for c in clean.checks}


def test_doctor_reads_the_vendors_words_and_pins():
    from rlctl.doctor.runner import run_doctor

    rows = {c.name: c for c in run_doctor(toy({"TOY_DEVICES": "2", "TOY_QUEUE_DEPTH": "4"})).checks}
    assert rows["platform"].verdict == "PASS" and rows["platform"].details["ray_resource"] == "TOYPU"
    assert rows["pin:toy-queue-depth"].verdict == "FAIL"
    assert rows["pin:toy-queue-depth"].details["source"].startswith("toy driver 1.0")
    missing = {c.name: c for c in run_doctor(toy({"RLCTL_PLATFORM": "toy"})).checks}
    assert missing["platform"].verdict == "FAIL"
    assert missing["platform"].fix == "load the toy driver (modprobe toy) and set TOY_DEVICES"


def test_doctor_reports_the_vendors_own_packages(tmp_path, monkeypatch):
    """The toy's management library and its torch extension (declared in toy.py only) get
    version rows, a requirement check and, with ``--deep``, an import, as a built-in vendor's do."""
    from rlctl.doctor.checks_packages import check_consistency, check_packages
    from rlctl.doctor.deep import try_imports
    from tests.platforms.fakes import make_dist

    site = tmp_path / "site"
    make_dist(site, "torch-toy", "1.2", requires=("toy-runtime>=2",))
    (site / "torch_toy").mkdir()
    (site / "torch_toy" / "__init__.py").write_text("raise ImportError('libtoy.so: cannot open shared object')\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    env = {"TOY_DEVICES": "1"}
    p = resolve_platform(env=env, host=Host(env=env, path=[str(site)]), entry_points=[TOY])
    rows = {c.name: c for c in check_packages(p)}
    assert rows["package:torch-toy"].verdict == "PASS" and rows["package:torch-toy"].details["version"] == "1.2"
    assert rows["package:toy-smi"].verdict == "SKIP"
    deps = {c.name: c for c in check_consistency(p)}
    assert deps["deps:torch-toy"].verdict == "FAIL" and "toy-runtime>=2" in deps["deps:torch-toy"].reason
    assert "libtoy.so" in try_imports(p, timeout=60)["torch_toy"]
    # a built-in platform on the same host knows nothing of the toy's packages
    from rlctl.platforms.cpu import CpuPlatform

    assert "package:torch-toy" not in {c.name for c in check_packages(CpuPlatform(p.host))}


class WhereAmI(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def where(self) -> tuple[str, str, str]:
        return str(self.device), self.ctx.device_type, self.device_runtime.dist_backend

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def join(self) -> str:
        import torch.distributed as dist

        self.init_distributed()
        try:
            return dist.get_backend()
        finally:
            dist.destroy_process_group()


def test_workers_run_on_the_device_the_platform_declares():
    """The pool carries the platform's runtime spec to every rank: a ``TOYPU`` pool's workers
    run on torch's CPU device over gloo (no table maps the Ray resource to a device)."""
    spec = toy({"TOY_DEVICES": "2"}).runtime_spec()
    pool = ResourcePool(1, 2, "TOYPU", runtime=spec)
    group = spawn_colocated(pool, {"w": WhereAmI}, mesh={"dp": 2}, backend="inprocess")["w"]
    assert group.where() == [("cpu", "cpu", "gloo")] * 2
    one = spawn_colocated(ResourcePool(1, 1, "TOYPU", runtime=spec), {"w": WhereAmI}, backend="inprocess")[
        "w"
    ]
    assert one.join() == ["gloo"]


def test_an_accelerator_pool_without_the_platforms_spec_is_refused():
    with pytest.raises(UserError, match="needs runtime=platform.runtime_spec"):
        spawn_colocated(ResourcePool(1, 1, "TOYPU"), {"w": WhereAmI}, backend="inprocess")
    with pytest.raises(UserError, match="not the platform's Ray resource 'TOYPU'"):
        ResourcePool(1, 1, "GPU", runtime=toy({"TOY_DEVICES": "1"}).runtime_spec())


def test_unreadable_or_malformed_pin_data_is_one_line_naming_the_file(tmp_path):
    from rlctl.platforms.pin_checks import evaluate_pins
    from tests.platforms.toy_vendor.toy import ToyPlatform

    class Missing(ToyPlatform):
        pin_data = str(tmp_path / "nowhere.toml")

    with pytest.raises(UserError, match="nowhere.toml: the platform's pin data cannot be read"):
        evaluate_pins(Missing(Host(env={})))
    bad = tmp_path / "bad.toml"
    bad.write_text('[[pin]]\nid = "x"\nkind = "env"\n')

    class Malformed(ToyPlatform):
        pin_data = str(bad)

    with pytest.raises(UserError, match=r"bad.toml: pin\[0\] \(x\): key 'source'"):
        evaluate_pins(Malformed(Host(env={})))
