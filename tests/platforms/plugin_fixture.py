"""Out-of-tree platform plugins used by the tests (loaded through real EntryPoint objects)."""

from __future__ import annotations

from rlctl.platforms import Platform, ProbeResult


class AcmePlatform(Platform):
    """A vendor whose probe finds its hardware wherever the ``ACME_DEVICES`` variable is set."""

    name = "acme"
    dist_backend = "gloo"
    ray_resource = "ACME"
    device_type = "cpu"
    torch_flavours = ("cpu",)
    engine_order = ("hf",)

    def _probe(self) -> ProbeResult:
        n = self.host.env.get("ACME_DEVICES")
        if n:
            return ProbeResult(True, f"ACME_DEVICES={n}", {"devices": [{"index": i} for i in range(int(n))]})
        return ProbeResult(False, "ACME_DEVICES is not set")


class ZetaPlatform(AcmePlatform):
    name = "zeta"

    def _probe(self) -> ProbeResult:
        return ProbeResult(True, "zeta always matches")


def broken_factory(host=None):
    raise RuntimeError("vendor SDK missing")


def not_a_platform(host=None):
    return object()


class SleepyPlatform(AcmePlatform):
    """A vendor SDK that hangs while probing (a wedged driver, a network license check)."""

    name = "sleepy"

    def _probe(self) -> ProbeResult:
        import time

        time.sleep(600)
        return ProbeResult(True, "never")


class ExitingProbe(AcmePlatform):
    """A vendor SDK that calls sys.exit when its device is missing."""

    name = "exiter"

    def _probe(self) -> ProbeResult:
        import sys

        sys.exit("no device")


def exiting_factory(host=None):
    import sys

    sys.exit(3)
