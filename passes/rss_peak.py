"""A process's exact peak resident set over a stretch of its run: its resident set read just before every system
call that can lower it.

The kernel's high-water mark (VmHWM) is not exact. It is raised only when the resident set is about to fall (in
munmap, brk, madvise) and then from the approximate sum of the per-CPU RSS counters: each CPU holds up to 31 pages
(the counters' batch) not yet added to it. Measured on Linux 6.18 with 2 CPUs: mapping, touching and unmapping
256-1000 pages raised VmHWM by 30-84 pages less than were touched (0.12-0.33 MiB), while VmRSS, which /proc sums over
the CPUs, counted every page. So a measured peak fell short of what onnxruntime held: at batch 32 the Hugging Face
inference rewrites at their minima allocated 0.2-1.5% more than their predicted activations (an allocation tracer),
where VmHWM rose by up to 0.21 MiB less (docs/measurements.md).

`PeakWatch` installs a seccomp filter (on every thread of the process, and threads started later) that hands each
munmap, mremap, brk and madvise to a watcher process before the kernel runs it; the watcher reads the process's
VmRSS and lets the call go on. The largest reading since `start`, and the resident set at `peak`, are the peak. The
filter stays for the process's life and makes each such call a round trip to the watcher (tens of microseconds), so
only measuring children install it, once their sessions are compiled. Where seccomp's user notification is missing
(kernels before 5.5, other architectures, a sandbox refusing it) `PeakWatch.install` returns None and the caller
falls back on VmHWM.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import select
import socket
import struct
import subprocess
import sys
from pathlib import Path

_LOWERING_CALLS = {  # munmap, mremap, brk, madvise
    "x86_64": (0xC000003E, (11, 25, 12, 28)),
    "aarch64": (0xC00000B7, (215, 216, 214, 233)),
}
"""Per machine: seccomp's audit architecture and the numbers of the system calls that can lower the resident set."""
_SECCOMP_SYSCALL = {"x86_64": 317, "aarch64": 277}
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_FILTER_FLAGS = 1 | 8 | 16  # TSYNC (every thread), NEW_LISTENER (a notification fd), TSYNC_ESRCH (allowed with it)
_RET_ALLOW, _RET_USER_NOTIF = 0x7FFF0000, 0x7FC00000
_NOTIF_BYTES, _RESP_BYTES = 80, 24  # struct seccomp_notif, struct seccomp_notif_resp
_NOTIF_RECV = (3 << 30) | (_NOTIF_BYTES << 16) | (ord("!") << 8) | 0  # _IOWR('!', 0, struct seccomp_notif)
_NOTIF_SEND = (3 << 30) | (_RESP_BYTES << 16) | (ord("!") << 8) | 1  # _IOWR('!', 1, struct seccomp_notif_resp)
_FLAG_CONTINUE = 1
_M_TRIM_THRESHOLD = -1  # mallopt's parameter number
_NO_TRIM = 2**30
_DEFAULT_TRIM_THRESHOLD = 128 * 1024  # glibc's, where MALLOC_TRIM_THRESHOLD_ does not set it


class PeakWatch:
    """The exact peak of this process's resident set between `start` and `peak`, read by a watcher process."""

    def __init__(self, watcher: subprocess.Popen[bytes], control: socket.socket):
        self._watcher = watcher
        self._control = control

    @classmethod
    def install(cls) -> PeakWatch | None:
        """Start the watcher and filter this process's lowering calls through it; None where seccomp cannot."""
        machine = platform.machine()
        if sys.platform != "linux" or machine not in _LOWERING_CALLS:
            return None
        ours, theirs = socket.socketpair()
        watcher = subprocess.Popen(  # started before the filter, which a child would inherit
            [sys.executable, "-P", "-m", "onnx_remat.passes.rss_peak", str(os.getpid()), str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
        )
        theirs.close()
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_TRIM_THRESHOLD, _NO_TRIM)  # a heap trim (brk) before the watcher has the listener would wait
        listener = _install_filter(machine)  # for it forever
        if listener is not None:
            socket.send_fds(ours, [b"f"], [listener])
            os.close(listener)
        libc.mallopt(_M_TRIM_THRESHOLD, int(os.environ.get("MALLOC_TRIM_THRESHOLD_", _DEFAULT_TRIM_THRESHOLD)))
        if listener is None:
            ours.close()
            watcher.wait()
            return None
        watch = cls(watcher, ours)
        watch._ask(b"s")
        return watch

    def start(self) -> None:
        """Forget the readings so far: the peak from now on."""
        self._ask(b"s")

    def peak(self) -> int:
        """The largest resident set (bytes) since `start`: before each lowering call, and now."""
        return max(self._ask(b"p"), _resident_bytes(os.getpid()))

    def _ask(self, request: bytes) -> int:
        self._control.sendall(request)
        return int(struct.unpack("q", _receive_exactly(self._control, 8))[0])


def _receive_exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        part = connection.recv(size - len(data))
        if not part:
            raise ConnectionError("the resident-set watcher ended")
        data += part
    return data


def _install_filter(machine: str) -> int | None:
    """Filter every thread's lowering calls to a user notification: the listener's fd, or None if refused."""
    arch, numbers = _LOWERING_CALLS[machine]
    load_nr, load_arch, ret = 0x20, 0x20, 0x06  # BPF_LD|BPF_W|BPF_ABS, then BPF_RET|BPF_K
    jeq = 0x15  # BPF_JMP|BPF_JEQ|BPF_K
    program = [(load_arch, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, _RET_ALLOW), (load_nr, 0, 0, 0)]
    for k, number in enumerate(numbers):
        program.append((jeq, len(numbers) - k, 0, number))  # to the notifying return after the allowing one
    program += [(ret, 0, 0, _RET_ALLOW), (ret, 0, 0, _RET_USER_NOTIF)]
    filters = b"".join(struct.pack("HBBI", *instruction) for instruction in program)
    buffer = ctypes.create_string_buffer(filters, len(filters))
    fprog = struct.pack("HxxxxxxQ", len(program), ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    long = ctypes.c_long
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, long(1), long(0), long(0), long(0)) != 0:
        return None
    listener = libc.syscall(long(_SECCOMP_SYSCALL[machine]), long(_SECCOMP_SET_MODE_FILTER), long(_FILTER_FLAGS),
                            ctypes.c_char_p(fprog))
    return int(listener) if listener >= 0 else None


def _resident_bytes(pid: int) -> int:
    """The process's VmRSS in bytes: exact to the page on Linux 6.18, which sums the CPUs' counters for /proc (an
    older kernel that reads the approximate sum here too leaves the watch as short as VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise KeyError("VmRSS")


def _watch(pid: int, control: socket.socket) -> None:
    """The watcher's loop: answer each notification after reading the resident set, and each request on `control`
    ('s': start again, 'p': the largest reading since) with the largest reading; until the filtered process has
    ended (its calls until then keep being answered, its exit's included)."""
    _, fds, _, _ = socket.recv_fds(control, 1, 1)
    if not fds:
        return  # the filter was refused: nothing to watch
    listener = fds[0]
    libc = ctypes.CDLL(None, use_errno=True)
    notification = ctypes.create_string_buffer(_NOTIF_BYTES)
    poll = select.poll()
    poll.register(listener, select.POLLIN)
    poll.register(control, select.POLLIN)
    largest = 0
    while True:
        for fd, events in poll.poll():
            if fd == listener and events & select.POLLHUP:
                return  # no filtered task is left
            if fd == listener:
                ctypes.memset(notification, 0, _NOTIF_BYTES)
                if libc.ioctl(listener, ctypes.c_ulong(_NOTIF_RECV), notification) != 0:
                    continue  # the call was interrupted meanwhile
                with contextlib.suppress(OSError):  # the process may end meanwhile
                    largest = max(largest, _resident_bytes(pid))
                (call,) = struct.unpack_from("Q", notification, 0)
                response = ctypes.create_string_buffer(struct.pack("QqiI", call, 0, 0, _FLAG_CONTINUE), _RESP_BYTES)
                libc.ioctl(listener, ctypes.c_ulong(_NOTIF_SEND), response)
                continue
            request = control.recv(1)
            if not request:
                poll.unregister(control)
                continue
            if request == b"s":
                largest = 0
            control.sendall(struct.pack("q", largest))


if __name__ == "__main__":
    _watch(int(sys.argv[1]), socket.socket(fileno=int(sys.argv[2])))
