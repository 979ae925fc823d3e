"""A solver backend in a child process: start a worker script, stream its stdout lines, stop it on an event.

The backends that run out of process (CP-SAT, HiGHS on larger models) share these mechanics: the worker
reads its model from a file, prints one line per progress report on stdout and writes its answer to a
file. Setting `stop` closes the worker's stdin, which it reads in a thread, after which it should write its
answer with the best it has; a worker that has not exited `grace` seconds later (HiGHS in a root LP, which
checks no interrupt for tens of seconds) is killed, and the caller falls back to what it streamed. Workers
ignore SIGINT, which a terminal's Ctrl-C sends them too: the parent decides (its first Ctrl-C stops them
through the pipe, a second, KeyboardInterrupt, kills them at once). A pipe, not a signal: CP-SAT's own SIGINT
handler, still installed as its search ends, aborted a worker signalled just then (std::bad_function_call, 4
of 16 runs on a 5-operator problem stopped at its first solution; measured). On Linux a worker is also killed
by the kernel when its parent dies, even by SIGKILL, so no solver outlives the command that started it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from onnx_remat.core.errors import SolverError

GRACE = 5.0
"""Seconds a worker has, after its stdin closes, to write its answer and exit before it is killed: it usually takes
well under one, but on a loaded machine CP-SAT took over one to stop and the best schedule found was lost."""

PR_SET_PDEATHSIG = 1
"""prctl option: the signal the kernel sends a process when the thread that started it exits."""


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """A pre-exec hook asking the kernel to SIGKILL the worker when `parent` dies (Linux only; None elsewhere).
    libc is loaded here, before the fork, so the hook only makes one system call in the child."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

    def hook() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)

    return hook


def run_worker(
    worker: Path,
    arguments: Sequence[str],
    answer: Path,
    on_line: Callable[[str], None],
    stop: threading.Event,
    name: str,
    grace: float = GRACE,
) -> bool:
    """Run `python worker *arguments` until it writes `answer`, passing each stdout line to `on_line`.

    True when it answered; False when `stop` ended it before it could (killed after `grace`, or stopped
    while it started). Raises SolverError if it failed on its own."""
    log = answer.with_suffix(".log")
    command = [sys.executable, str(worker), *arguments]
    killed = threading.Event()
    with log.open("w") as errors, subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
        preexec_fn=_die_with_parent(os.getpid()),
    ) as child:
        threading.Thread(target=_stop_when, args=(stop, child, grace, killed), daemon=True).start()
        assert child.stdout is not None  # stdout=PIPE
        try:
            for line in child.stdout:
                on_line(line)
        except BaseException:
            child.kill()
            raise
    if child.returncode == 0 and answer.exists() and not killed.is_set():
        return True
    if stop.is_set():
        return False
    raise SolverError(f"{name}'s worker failed ({child.returncode}): {log.read_text().strip()[-2000:]}")


def _stop_when(stop: threading.Event, child: subprocess.Popen, grace: float, killed: threading.Event) -> None:
    """Close `child`'s stdin once `stop` is set and kill it if it is still running `grace` seconds later."""
    while child.poll() is None:
        if stop.wait(0.1):
            assert child.stdin is not None  # stdin=PIPE
            child.stdin.close()
            try:
                child.wait(grace)
            except subprocess.TimeoutExpired:
                killed.set()
                child.kill()
            return
