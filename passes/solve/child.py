"""A solver backend in a child process: start a worker script, stream its stdout lines, stop it on an event.

The backends that run out of process (CP-SAT, HiGHS on larger models) share these mechanics: the worker
reads its model from a file, prints one line per progress report on stdout and writes its answer to a
file. Setting `stop` closes the worker's stdin, which it reads in a thread, after which it should write its
answer with the best it has; a worker that has not exited `grace` seconds later (HiGHS in a root LP, which
checks no interrupt for tens of seconds) is killed, and the caller falls back to what it streamed; one that has
printed nothing yet (still starting, it holds nothing) is killed at once. Workers
ignore SIGINT, which a terminal's Ctrl-C sends them too: the parent decides (its first Ctrl-C stops them
through the pipe, a second, KeyboardInterrupt, kills them at once). A pipe, not a signal: CP-SAT's own SIGINT
handler, still installed as its search ends, aborted a worker signalled just then (std::bad_function_call, 4
of 16 runs on a 5-operator problem stopped at its first solution; measured). On Linux a worker is also killed
by the kernel when its parent dies, even by SIGKILL, so no solver outlives the command that started it.

A worker whose start-up is long (CP-SAT's imports OR-Tools: 0.3-0.5 s) can be started early (`started_early`): it
imports while this process reads and prepares the problem, then waits for its arguments as one JSON line on stdin.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
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


@dataclass(frozen=True)
class _Process:
    """A running worker and the file its stderr goes to."""

    child: subprocess.Popen
    log: Path


_EARLY: dict[Path, _Process] = {}
"""Workers started early (started_early) and not yet given arguments, by script."""


def _start(command: list[str], log: Path) -> _Process:
    """Start `command` with piped stdin and stdout, stderr to `log`, dying with this process."""
    with log.open("w") as errors:
        child = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            preexec_fn=_die_with_parent(os.getpid()),
        )
    return _Process(child, log)


@contextmanager
def started_early(worker: Path) -> Iterator[None]:
    """Start `worker` now, with no arguments, so that its imports overlap this process's work; the first run_worker
    of the same script within the block hands it its arguments instead of starting another. Killed if unused."""
    with tempfile.TemporaryDirectory() as directory:
        _EARLY[worker] = _start([sys.executable, str(worker)], Path(directory) / "early.log")
        try:
            yield
        finally:
            unused = _EARLY.pop(worker, None)
            if unused is not None:
                _end_unused(unused.child)


def _end_unused(child: subprocess.Popen) -> None:
    """Kill an early worker never given arguments (it holds nothing to lose; waiting for it to finish importing
    would keep the command up to half a second longer) and reap it."""
    assert child.stdin is not None and child.stdout is not None  # both PIPE
    child.kill()
    child.wait()
    child.stdin.close()
    child.stdout.close()


def _launch(worker: Path, arguments: Sequence[str], log: Path) -> _Process:
    """The early-started `worker` given `arguments` on stdin if one was started, else a new process with them."""
    early = _EARLY.pop(worker, None)
    if early is None:
        return _start([sys.executable, str(worker), *arguments], log)
    assert early.child.stdin is not None  # stdin=PIPE
    try:
        early.child.stdin.write(json.dumps(list(arguments)) + "\n")
        early.child.stdin.flush()
    except BrokenPipeError:  # it failed while starting: run_worker reports its exit code and log
        pass
    return early


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
    process = _launch(worker, arguments, answer.with_suffix(".log"))
    killed, spoke = threading.Event(), threading.Event()
    with process.child as child:
        threading.Thread(target=_stop_when, args=(stop, child, grace, killed, spoke), daemon=True).start()
        assert child.stdout is not None  # stdout=PIPE
        try:
            for line in child.stdout:
                spoke.set()
                on_line(line)
        except BaseException:
            child.kill()
            raise
    if child.returncode == 0 and answer.exists() and not killed.is_set():
        return True
    if stop.is_set():
        return False
    raise SolverError(f"{name}'s worker failed ({child.returncode}): {process.log.read_text().strip()[-2000:]}")


def _stop_when(
    stop: threading.Event, child: subprocess.Popen, grace: float, killed: threading.Event, spoke: threading.Event
) -> None:
    """Once `stop` is set close `child`'s stdin and kill it if it is still running `grace` seconds later; at once if it
    has printed nothing (`spoke` unset): still starting, it holds no solution, and a HiGHS child started just before
    the stop took 0.6 s to notice it (the peers' U-Net at 40% of keep-all, measured)."""
    while child.poll() is None:
        if stop.wait(0.1):
            if not spoke.is_set():
                killed.set()
                child.kill()
                return
            assert child.stdin is not None  # stdin=PIPE
            child.stdin.close()
            try:
                child.wait(grace)
            except subprocess.TimeoutExpired:
                killed.set()
                child.kill()
            return
