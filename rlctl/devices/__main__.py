"""``python -m rlctl.devices '<RuntimeSpec JSON>'``: how many of the platform's devices torch sees.

Doctor runs this as a child process (it must not import torch itself) and reads the one number
printed; an import or driver error exits non-zero with its message on stderr.
"""

from __future__ import annotations

import sys

from rlctl.devices.runtime import DeviceRuntime
from rlctl.platforms.runtime_spec import RuntimeSpec


def main(argv: list[str]) -> int:
    runtime = DeviceRuntime(RuntimeSpec.from_json(argv[0]))
    runtime.module  # noqa: B018 - import the device's torch module; its error is the answer
    print(runtime.device_count())
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a child process by rlctl.doctor.deep
    sys.exit(main(sys.argv[1:]))
