"""Errors a user can cause, each with the CLI exit code it maps to.

The message says what was wrong and what to do; the CLI prints it as one line on stderr.
"""

from __future__ import annotations


class RematError(Exception):
    """Base of every user-facing error; `exit_code` is what the CLI exits with."""

    exit_code = 1


class UsageError(RematError):
    """A malformed argument: budget, input shape, solver name, option combination."""

    exit_code = 2


class ModelError(RematError):
    """The input model cannot be used: missing, not ONNX, invalid, unsized, unsupported."""

    exit_code = 3


class InfeasibleBudgetError(RematError):
    """The requested budget is below what any schedule needs; carries that minimum in bytes."""

    exit_code = 4

    def __init__(self, message: str, minimum_bytes: int | None = None):
        super().__init__(message)
        self.minimum_bytes = minimum_bytes


class OutputError(RematError):
    """The output cannot be written where asked (exists, same as input, missing directory)."""

    exit_code = 5


class SolverError(RematError):
    """The solver found no schedule (time limit hit before any feasible point, backend missing)."""

    exit_code = 6


class ScheduleError(RematError):
    """A schedule failed the simulator: a bug in a solver, never a user error."""

    exit_code = 7


class OverBudgetError(RematError):
    """`onnx-remat run` measured (or predicted) a device's peak over its budget: the outputs are still written."""

    exit_code = 8


def one_line(exc: BaseException) -> str:
    """An exception's whole text on one line (its type if empty): library errors quoted in one-line messages keep
    what follows their first line break, such as the checker's node name."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


class RematWarning(UserWarning):
    """Something went wrong that the tool worked around (a bad cache entry measured again); the CLI prints it as one
    line on stderr."""
