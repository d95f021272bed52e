"""The platform's runtime half: its devices as torch sees them (device module, ``set_device``,
memory statistics, collective backend).

The declarative half (:mod:`rlctl.platforms`) never imports torch; it hands out a
:class:`~rlctl.platforms.runtime_spec.RuntimeSpec`, and :class:`DeviceRuntime` here turns that into torch
calls. Workers, engines and doctor's child processes use it instead of their own device tables.
Doctor and ``rlctl plan`` must not import this room in-process (it imports torch).
"""

from rlctl.devices.runtime import DeviceRuntime, runtime_of

__all__ = ["DeviceRuntime", "runtime_of"]
