"""The sandbox's seccomp filter (classic BPF for `bwrap --seccomp FD`, inherited by every process
of the kernel): EPERM for `sched_setaffinity` (a kernel stays on the cores it was given) and for
calls through another ABI (other numbers). x86_64 and aarch64 only; elsewhere no filter.
"""
from __future__ import annotations

import errno
import os
import platform
import struct

__all__ = ["REFUSED", "program", "filter_fd", "supported"]

# struct sock_filter {u16 code; u8 jt; u8 jf; u32 k;}, linux/filter.h and linux/seccomp.h
_LD_W_ABS = 0x20            # BPF_LD | BPF_W | BPF_ABS: A = the 32-bit word at offset k
_JEQ = 0x15                 # BPF_JMP | BPF_JEQ | BPF_K: A == k ? jt : jf
_JGE = 0x35                 # BPF_JMP | BPF_JGE | BPF_K: A >= k ? jt : jf
_RET = 0x06                 # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000         # SECCOMP_RET_ALLOW
_ERRNO = 0x00050000         # SECCOMP_RET_ERRNO | errno
_NR, _ARCH = 0, 4           # offsets in struct seccomp_data
_X32_BIT = 0x40000000       # __X32_SYSCALL_BIT: x32 calls are the x86_64 numbers + this

# machine -> (AUDIT_ARCH_* of the native ABI, {refused call: its number}, x32 calls exist)
_ABIS = {
    "x86_64": (0xC000003E, {"sched_setaffinity": 203}, True),
    "aarch64": (0xC00000B7, {"sched_setaffinity": 122}, False),
}
REFUSED = ("sched_setaffinity",)


def supported(machine: str | None = None) -> bool:
    return (machine or platform.machine()) in _ABIS


def program(machine: str | None = None) -> bytes:
    """The filter for `machine` (default: this one) as bwrap reads it: the sock_filter array."""
    machine = machine or platform.machine()
    if machine not in _ABIS:
        raise RuntimeError(f"no seccomp filter for the {machine} architecture (known: "
                           f"{', '.join(_ABIS)})")
    arch, numbers, x32 = _ABIS[machine]
    # (op, jt, jf, k); a check's jt / jf is "next" or "refuse" (the last instruction), turned
    # into a jump offset (instructions skipped after the jump) once the length is known.
    code = [(_LD_W_ABS, 0, 0, _ARCH), (_JEQ, "next", "refuse", arch), (_LD_W_ABS, 0, 0, _NR)]
    if x32:
        code.append((_JGE, "refuse", "next", _X32_BIT))
    code += [(_JEQ, "refuse", "next", numbers[name]) for name in REFUSED]
    code += [(_RET, 0, 0, _ALLOW), (_RET, 0, 0, _ERRNO | errno.EPERM)]
    refuse = len(code) - 1
    out = []
    for pc, (op, jt, jf, k) in enumerate(code):
        jt, jf = (refuse - pc - 1 if j == "refuse" else 0 for j in (jt, jf))
        out.append(struct.pack("=HBBI", op, jt, jf, k))
    return b"".join(out)


def filter_fd() -> int | None:
    """A file descriptor holding program() for `bwrap --seccomp FD`; None if unknown here."""
    if not supported():
        return None
    fd = os.memfd_create("autograder-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, program())
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
