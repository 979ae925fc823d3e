"""Signals a pipeline or a user sends a running command: SIGTERM and SIGHUP unwind it like Ctrl-C (nothing written,
no temporary file or directory left, the solver worker stopped), and a parent killed outright takes its worker
with it. Each test waits for HiGHS's worker process to start, so the signal lands during the solve."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

from onnx_remat import models

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads processes from /proc")

WAIT_SECONDS = 120.0
"""How long a test waits for a process to appear or go; generous for a loaded machine, never a solver's speed."""

ONNXRUNTIME_SESSION_FILE = ".ses"
"""What importing onnxruntime leaves in the temporary folder (its telemetry session id), not a file of ours."""


def _processes() -> dict[int, tuple[int, str, str]]:
    """Every process as pid -> (parent pid, state letter, command line)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        found[int(stat.parent.name)] = (int(fields[1]), fields[0], command)
    return found


def _alive(pid: int) -> bool:
    entry = _processes().get(pid)
    return entry is not None and entry[1] != "Z"


def _wait_for_worker(command: subprocess.Popen) -> int:
    """The pid of the HiGHS worker `command` started (fails if the command ends first)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        assert command.poll() is None, command.stderr.read()
        for pid, (parent, _, line) in _processes().items():
            if parent == command.pid and "highs_worker" in line:
                return pid
        time.sleep(0.05)
    raise AssertionError("no solver worker started")


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while _alive(pid):
        assert time.monotonic() < deadline, f"process {pid} outlived its parent"
        time.sleep(0.05)


@pytest.fixture
def long_solve(tmp_path):
    """A command searching the minimum budget of a ResNet-18 training step (its peak-minimising MILP runs in HiGHS's
    child process) with an hour to do it."""
    source = tmp_path / "resnet18.onnx"
    onnx.save(models.build("resnet18", batch=2, resolution=32), source)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    command = [sys.executable, "-m", "onnx_remat.cli.entry", str(source), str(tmp_path / "out.onnx"), "--mode", "train",
               "--budget", "min", "--solver", "highs", "--time-limit", "3600", "--report", str(tmp_path / "r.json")]
    environment = {**os.environ, "TMPDIR": str(scratch)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
    yield process, tmp_path, scratch
    if process.poll() is None:
        process.kill()
    process.wait()


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_termination_signal_leaves_nothing_behind(long_solve, signum):
    process, folder, scratch = long_solve
    worker = _wait_for_worker(process)
    process.send_signal(signum)
    _, errors = process.communicate(timeout=WAIT_SECONDS)
    assert process.returncode == 128 + signum
    assert errors.strip().endswith(f"onnx-remat: stopped by {signal.Signals(signum).name}; nothing written")
    assert "Traceback" not in errors
    assert sorted(p.name for p in folder.iterdir()) == ["resnet18.onnx", "scratch"]
    assert [p.name for p in scratch.iterdir() if p.name != ONNXRUNTIME_SESSION_FILE] == []
    _wait_gone(worker)


@pytest.mark.slow
def test_a_killed_command_takes_its_solver_worker_with_it(long_solve):
    process, _, _ = long_solve
    worker = _wait_for_worker(process)
    process.kill()
    process.wait()
    _wait_gone(worker)
