"""The toy vendor's platform: its devices are CPU cores that Ray schedules as ``TOYPU``.

Everything rlctl needs of a vendor is here and in ``toy_pins.toml`` beside it: the probe, the
collective backend, the Ray resource, torch's name for the device, the visible-devices variable,
the fixes doctor prints, the packages doctor reports, and where its pin data is.
"""

from __future__ import annotations

from pathlib import Path

from rlctl.platforms import Platform, ProbeResult


class ToyPlatform(Platform):
    """Found wherever ``TOY_DEVICES`` names a device count."""

    name = "toy"
    dist_backend = "gloo"
    ray_resource = "TOYPU"
    device_type = "cpu"  # the runtime half drives it through torch's CPU device
    torch_flavours = ("cpu",)
    engine_order = ("hf",)
    pin_data = str(Path(__file__).with_name("toy_pins.toml"))
    torch_install = "pip install torch --index-url https://toy.example/whl/cpu"
    driver_fix = "load the toy driver (modprobe toy) and set TOY_DEVICES"
    smi_tool = "toy-smi"
    tool_dists = ("toy-smi",)  # doctor's package rows: the library the probe reads devices through
    stack_dists = {"torch-toy": "torch_toy"}  # the torch extension: a version, deps and import row

    @property
    def visible_devices_env(self) -> str:
        return "TOY_VISIBLE_DEVICES"

    def _probe(self) -> ProbeResult:
        n = self.host.env.get("TOY_DEVICES")
        if not n:
            return ProbeResult(False, "TOY_DEVICES is not set")
        return ProbeResult(True, f"TOY_DEVICES={n}", {"devices": [{"index": i} for i in range(int(n))]})
