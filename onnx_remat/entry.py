"""The `onnx-remat` console entry point: signals are handled before the command's modules load, so Ctrl-C or SIGTERM
during start-up ends as cleanly (one line, exit 130/143/129) as one during the work."""

from __future__ import annotations

import sys

from onnx_remat.signals import INTERRUPTED_CODE, INTERRUPTED_MESSAGE, Terminated, terminated_on_signals


def main() -> int:
    try:
        with terminated_on_signals():
            from onnx_remat.cli import main as run_command

            return run_command()
    except KeyboardInterrupt:
        print(INTERRUPTED_MESSAGE, file=sys.stderr)
        return INTERRUPTED_CODE
    except Terminated as stop:
        print(stop.message, file=sys.stderr)
        return stop.exit_code


if __name__ == "__main__":
    sys.exit(main())
