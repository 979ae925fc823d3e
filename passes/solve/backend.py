"""What a MILP backend is: the sparse model it is handed, the outcome it returns, the statuses a solve ends in.

A backend is a function of the `Backend` protocol; each lives in its own module (highs.py, cbc.py, cpsat.py) and
is registered by one line in BACKENDS (passes/solve/__init__.py). Backends see no Problem and no Schedule: only a
SparseMilp, whose solution vector the caller maps back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import numpy as np

from onnx_remat.passes.solve.sparse import Compressed


class SolveStatus(StrEnum):
    """How a backend run or a whole solve ended. The values are what reports, JSON and the worker scripts write."""

    OPTIMAL = "optimal"
    """Proven optimal within the gaps asked for."""
    TIME_LIMIT = "time_limit"
    """The time limit ran out before optimality was proven: the best solution found."""
    HEURISTIC = "heuristic"
    """A heuristic's schedule (a baseline, the eviction heuristic, Chen's segments, a hint): the MILP was too large
    to build, or its backend returned no solution in time."""
    INTERRUPTED = "interrupted"
    """Stopped by Ctrl-C (the stop event): the best solution found so far."""
    INFEASIBLE = "infeasible"
    """Proven that no schedule fits the budgets: a backend's answer, and a sweep point's at such a budget (a solve
    raises InfeasibleBudgetError instead)."""
    MEASURED = "measured"
    """Set by the pipeline, not a solver: picking by running (--pick-by-running) kept a schedule other than the
    solver's, measured faster on the devices."""


MilpProgress = Callable[[float, float | None, float | None], None]
"""(solver seconds, incumbent objective or None, bound or None), in model units."""


@dataclass(frozen=True)
class SparseMilp:
    """Minimize cost @ x subject to row_lower <= matrix @ x <= row_upper, col bounds, integrality."""

    cost: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    integer: np.ndarray
    matrix: Compressed
    row_lower: np.ndarray
    row_upper: np.ndarray
    byte_unit: float = 1.0
    """Bytes per unit of the memory columns and of the coefficients of memory rows (continuous columns not
    within [0, 1]): scaling by it makes them whole bytes, for backends that need integers (CP-SAT)."""


@dataclass(frozen=True)
class MilpOutcome:
    """What a backend found: a solution vector (or None), a status (OPTIMAL, TIME_LIMIT, INTERRUPTED or
    INFEASIBLE) and a bound (or None)."""

    x: np.ndarray | None
    status: SolveStatus
    bound: float | None


class Backend(Protocol):
    """Solve `milp` within `time_limit` seconds (None: no limit), starting from `warm_start` if given, reporting to
    `progress`, stopping at the relative and absolute `gaps`, and with the best solution so far once `stop` is set
    (status INTERRUPTED)."""

    def __call__(
        self,
        milp: SparseMilp,
        time_limit: float | None = None,
        warm_start: np.ndarray | None = None,
        progress: MilpProgress | None = None,
        gaps: tuple[float, float] = (1e-4, 1e-6),
        stop: threading.Event | None = None,
    ) -> MilpOutcome: ...
