"""The `onnx-remat` console entry point: signals are handled before the command's modules load, so Ctrl-C or SIGTERM
during start-up ends as cleanly (one line, exit 130/143/129) as one during the work.

A signal that lands inside a native extension's initialisation (onnxruntime's, onnx's) breaks it: an ImportError
traceback or an abort. The heavy modules a command needs are therefore imported first with the signals held back
(`--help` needs none of them); a signal sent meanwhile is handled the moment they are loaded.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
from typing import NoReturn

from onnx_remat.cli.signals import (
    INTERRUPTED_CODE,
    INTERRUPTED_MESSAGE,
    Terminated,
    ignore_signals,
    terminated_on_signals,
)

HEAVY_MODULES = {"solve": ("onnx_remat.passes.solve",), "run": ("onnx_remat.execution",)}
"""What each subcommand loads that holds native extensions; the main command and the others load the pipeline."""
PIPELINE = ("onnx_remat.pipeline",)
HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM} | ({signal.SIGHUP} if hasattr(signal, "SIGHUP") else set())
SIGNAL_CODES = {INTERRUPTED_CODE} | {128 + signum for signum in HELD_SIGNALS - {signal.SIGINT}}
"""The exit codes of a command a signal stopped."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    started = time.perf_counter()
    try:
        with terminated_on_signals():
            _import_uninterrupted(argv)
            from onnx_remat.cli.main import main as run_command

            code = run_command(argv, started)
            if code == 0:
                ignore_signals()
    except KeyboardInterrupt:
        _stop(INTERRUPTED_MESSAGE, INTERRUPTED_CODE)
    except Terminated as stop:
        _stop(stop.message, stop.exit_code)
    if code in SIGNAL_CODES or _main_command(argv):
        _stop("", code)
    return code


def _main_command(argv: list[str]) -> bool:
    """Whether `argv` ran the main command (not a subcommand), which ends without the interpreter's shutdown: freeing
    its model's objects took 0.9 s after DenseNet-121's training step was written, 4.5 s beside two busy loops, past
    the time limit (tools/bench_load.py --stages, measured)."""
    from onnx_remat.cli.main import COMMANDS

    return not argv or argv[0] not in COMMANDS


def _import_uninterrupted(argv: list[str]) -> None:
    """Import the heavy modules the command will need with SIGINT, SIGTERM and SIGHUP held back (where the platform
    can hold signals); held signals arrive once the imports are done."""
    if "-h" in argv or "--help" in argv or not hasattr(signal, "pthread_sigmask"):
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        for module in HEAVY_MODULES.get(argv[0] if argv else "", PIPELINE):
            importlib.import_module(module)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _stop(message: str, code: int) -> NoReturn:
    """Print `message` and end at once with `code`, without the interpreter's shutdown: after a signal it joins the
    solver's timer threads, and some interrupted runs then ended by SIGINT (-2) instead of 130 (docs/measurements.md);
    after the main command it frees the model's objects for seconds (`_main_command`)."""
    if message:
        print(message, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
