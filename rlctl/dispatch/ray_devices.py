"""Which device a Ray worker runs on, and how a pool asks Ray to leave the node's devices visible.

Read from Ray 2.60 (``ray/_private/accelerators/{nvidia_gpu,amd_gpu,npu}.py``, ``_private/utils.py``
``set_visible_accelerator_ids``, ``_private/worker.py`` ``get_accelerator_ids_for_accelerator_resource``):

- At an actor's start Ray sets the vendor's visible-devices variable (``CUDA_VISIBLE_DEVICES``,
  ``HIP_VISIBLE_DEVICES``, ``ASCEND_RT_VISIBLE_DEVICES``) to the ids it assigned the actor, unless
  the vendor's ``RAY_EXPERIMENTAL_NOSET_*`` variable is true in the worker's environment (a
  ``runtime_env`` ``env_vars`` entry is); then the worker keeps the node's visibility.
- ``ray.get_runtime_context().get_accelerator_ids()[resource]`` is the assigned ids either way, as
  entries of the visible-devices variable the node started with (or device numbers where it was
  unset); every vendor's manager reads the variable as a comma-separated list.

So a worker's own device is the position of its assigned id in the list it sees: 0 where Ray
narrowed the list to that id, the id's place among the node's devices where it did not (the index
verl takes as the id itself, which is only right where the node's list is unset).
"""

from __future__ import annotations

import os

from rlctl.errors import RunError, UserError
from rlctl.platforms.runtime_spec import RuntimeSpec


def visible_ids(value: str | None) -> list[str] | None:
    """The visible-devices variable as Ray's managers read it (None: unset, every device)."""
    if value is None:
        return None
    if value in ("", "NoDevFiles"):
        return []
    return value.split(",")


def device_index(assigned: list[str], visible: str | None) -> int | None:
    """The torch index of the one device Ray ``assigned`` a worker among those it sees (the
    visible-devices variable's value ``visible``); None where it cannot be told (not one id, or an
    id the worker does not see)."""
    if len(assigned) != 1:
        return None
    (mine,) = assigned
    seen = visible_ids(visible)
    if seen is None:
        return int(mine) if mine.isdigit() else None
    return seen.index(mine) if mine in seen else None


def noset_env(spec: RuntimeSpec, why: str) -> dict[str, str]:
    """The worker variables that keep Ray from narrowing device visibility on ``spec``'s devices
    (none on the CPU); a UserError naming ``why`` where the platform's Ray has no such switch."""
    if spec.is_cpu:
        return {}
    if not spec.ray_noset_env:
        raise UserError(
            f"{why}: each rank must see its node's {spec.device_type} devices, and Ray has no "
            f"RAY_EXPERIMENTAL_NOSET_* variable for {spec.ray_resource} on this platform"
        )
    return {spec.ray_noset_env: "1"}


def own_device(spec: RuntimeSpec, rank: int, required: bool) -> int | None:
    """This Ray worker's device index, from the ids Ray assigned it (``ray.get_runtime_context()
    .get_accelerator_ids()``). None on the CPU or, unless ``required`` (the worker sees the whole
    node, so device 0 would be wrong), where it cannot be told; then a RunError naming the rank."""
    if spec.is_cpu:
        return None
    import ray

    assigned = [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get(spec.ray_resource, [])]
    visible = os.environ.get(spec.visible_devices_env) if spec.visible_devices_env else None
    index = device_index(assigned, visible)
    if index is None and required:
        raise RunError(
            f"rank {rank}: Ray assigned {spec.ray_resource} {assigned or 'none'}, which is not one device "
            f"among those it sees ({spec.visible_devices_env}={visible if visible is not None else '(unset)'})"
        )
    return index
