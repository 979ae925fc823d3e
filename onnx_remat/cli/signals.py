"""SIGTERM and SIGHUP as an exception, so a stopped command unwinds as at Ctrl-C: temporary files and directories
are removed and solver workers killed on the way out. Imports nothing heavy: the entry point uses it before the
runtimes load."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(BaseException):
    """SIGTERM or SIGHUP, raised in the main thread."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def message(self) -> str:
        return f"onnx-remat: stopped by {signal.Signals(self.signum).name}; nothing written"


INTERRUPTED_CODE = 130
INTERRUPTED_MESSAGE = "onnx-remat: interrupted; nothing written"


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


@contextmanager
def terminated_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into `Terminated` while the block runs (main thread only, as signals require); on the
    way out the earlier handlers come back, unless the block set others (`ignore_signals`)."""
    names = [signal.SIGTERM, signal.SIGHUP] if hasattr(signal, "SIGHUP") else [signal.SIGTERM]
    previous = {signum: signal.signal(signum, _raise_terminated) for signum in names}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if signal.getsignal(signum) is _raise_terminated:
                signal.signal(signum, handler)


def ignore_signals() -> None:
    """Ignore SIGINT, SIGTERM and SIGHUP from now on: a finished command's outputs are written, and a signal during
    the interpreter's shutdown would only turn its exit code into the signal's."""
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
