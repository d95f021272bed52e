"""The sandbox's seccomp filter: a classic-BPF program the launcher installs just before exec.

The snippet keeps every system call a Python program needs and loses the ones that reach past its
namespaces: creating or joining namespaces (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*``
flag), keyrings (``add_key``, ``keyctl``, ``request_key``: kernel state that outlives the run),
other processes' memory (``ptrace``, ``process_vm_*``), ``bpf``, ``perf_event_open``, mounts,
modules, ``io_uring`` (whose operations bypass seccomp), raw and packet sockets. Denied calls fail
with EPERM (``clone3`` with ENOSYS, so libc falls back to ``clone``, whose flags the filter can
read); a call from another ABI (i386, x32) kills the process.

Syscall numbers are Linux's uapi: ``asm/unistd_64.h`` (x86_64) and ``asm-generic/unistd.h``
(aarch64). The filter is built here and passed to the stdlib-only launcher as bytes.
"""

from __future__ import annotations

import errno
import functools
import platform
import struct

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_BIT = 0x40000000  # x86_64 only: syscalls of the x32 ABI

# name: (x86_64, aarch64)
SYSCALLS = {
    "unshare": (272, 97), "setns": (308, 268), "clone": (56, 220), "clone3": (435, 435),
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "move_mount": (429, 429), "open_tree": (428, 428), "mount_setattr": (442, 442),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "init_module": (175, 105),
    "finit_module": (313, 273), "delete_module": (176, 106), "swapon": (167, 224),
    "swapoff": (168, 225), "reboot": (169, 142), "acct": (163, 89), "quotactl": (179, 60),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "socket": (41, 198),
}  # fmt: skip
DENIED = tuple(n for n in SYSCALLS if n not in ("clone", "clone3", "socket"))
CLONE_NEW_FLAGS = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
AF_PACKET, SOCK_RAW, SOCK_TYPE_MASK = 17, 3, 0xF

_LD_ABS_W, _JEQ, _JGE, _JSET, _AND, _RET = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06
RET_KILL_PROCESS, RET_ALLOW = 0x80000000, 0x7FFF0000
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24  # offsets in struct seccomp_data (little-endian low words)


def _errno(code: int) -> int:
    return 0x00050000 | code  # SECCOMP_RET_ERRNO


def _insn(code: int, k: int = 0, jt: int = 0, jf: int = 0) -> tuple[int, int, int, int]:
    return (code, jt, jf, k)


def syscall_numbers(machine: str) -> dict[str, int]:
    """name -> syscall number on ``machine`` (``platform.machine()``), for the calls listed here."""
    col = 0 if machine == "x86_64" else 1
    return {name: nums[col] for name, nums in SYSCALLS.items()}


def filter_program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions for ``machine`` (``platform.machine()``)."""
    nr = syscall_numbers(machine)
    prog = [
        _insn(_LD_ABS_W, _ARCH),
        _insn(_JEQ, AUDIT_ARCH[machine], jt=1),
        _insn(_RET, RET_KILL_PROCESS),
        _insn(_LD_ABS_W, _NR),
    ]
    if machine == "x86_64":
        prog += [_insn(_JGE, _X32_BIT, jf=1), _insn(_RET, RET_KILL_PROCESS)]
    for name in DENIED:
        prog += [_insn(_JEQ, nr[name], jf=1), _insn(_RET, _errno(errno.EPERM))]
    prog += [_insn(_JEQ, nr["clone3"], jf=1), _insn(_RET, _errno(errno.ENOSYS))]
    prog += [
        _insn(_JEQ, nr["clone"], jf=4),
        _insn(_LD_ABS_W, _ARG0),
        _insn(_JSET, CLONE_NEW_FLAGS, jf=1),
        _insn(_RET, _errno(errno.EPERM)),
        _insn(_RET, RET_ALLOW),
    ]
    prog += [
        _insn(_JEQ, nr["socket"], jf=7),
        _insn(_LD_ABS_W, _ARG0),
        _insn(_JEQ, AF_PACKET, jf=1),
        _insn(_RET, _errno(errno.EPERM)),
        _insn(_LD_ABS_W, _ARG1),
        _insn(_AND, SOCK_TYPE_MASK),
        _insn(_JEQ, SOCK_RAW, jf=1),
        _insn(_RET, _errno(errno.EPERM)),
    ]
    return prog + [_insn(_RET, RET_ALLOW)]


@functools.cache
def seccomp_filter() -> bytes | None:
    """This host's filter as packed ``struct sock_filter`` array, or None where the arch is unknown."""
    machine = platform.machine()
    if machine not in AUDIT_ARCH:
        return None
    return b"".join(struct.pack("=HBBI", *insn) for insn in filter_program(machine))
