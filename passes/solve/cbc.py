"""The MILP on CBC through PuLP: CBC runs as a child process, its progress read from its log while it runs.

PuLP is imported on first use, not with this module: importing it takes time, and CBC is rarely the backend.
"""

from __future__ import annotations

import math
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from onnx_remat.core.errors import SolverError
from onnx_remat.passes.solve.backend import MilpOutcome, MilpProgress, SolveStatus, SparseMilp

if TYPE_CHECKING:
    import pulp


def solve_cbc(
    milp: SparseMilp,
    time_limit: float | None = None,
    warm_start: np.ndarray | None = None,
    progress: MilpProgress | None = None,
    gaps: tuple[float, float] = (1e-4, 1e-6),
    stop: threading.Event | None = None,
) -> MilpOutcome:
    """Solve with CBC through PuLP on 2 threads, progress read from CBC's log while it runs.

    CBC runs as a child process: Ctrl-C reaches it directly and it stops with its best solution; `stop`
    only marks the outcome "interrupted"."""
    import pulp

    start = time.perf_counter()
    problem, variables = _pulp_problem(milp)
    if warm_start is not None:
        for variable, value in zip(variables, warm_start, strict=True):
            variable.setInitialValue(round(value) if variable.cat == pulp.LpInteger else value)
    with tempfile.TemporaryDirectory() as directory:
        log = Path(directory) / "cbc.log"
        solver = pulp.PULP_CBC_CMD(
            msg=False,
            threads=2,
            timeLimit=time_limit,
            gapRel=gaps[0],
            gapAbs=gaps[1],
            warmStart=warm_start is not None,
            logPath=str(log),
        )
        done = threading.Event()
        watcher = threading.Thread(target=_watch_cbc_log, args=(log, done, progress, start), daemon=True)
        if progress is not None:
            watcher.start()
        try:
            problem.solve(solver)
        finally:
            done.set()
            if watcher.is_alive():
                watcher.join()
        text = log.read_text() if log.exists() else ""
    outcome = _cbc_outcome(problem, variables, text)
    if stop is not None and stop.is_set() and outcome.status != SolveStatus.OPTIMAL:
        outcome = MilpOutcome(outcome.x, SolveStatus.INTERRUPTED, outcome.bound)
    if progress is not None:
        incumbent = None if outcome.x is None else float(milp.cost @ outcome.x)
        progress(time.perf_counter() - start, incumbent, outcome.bound)
    return outcome


_CBC_PROGRESS = re.compile(r"Cbc0010I After \d+ nodes, \d+ on tree, (\S+) best solution, best possible (\S+)")


def _watch_cbc_log(log: Path, done: threading.Event, progress: MilpProgress, start: float, every: float = 0.5) -> None:
    """Report CBC's latest (incumbent, bound) from its node log lines every `every` seconds until `done`."""
    reported = None
    while not done.wait(every):
        text = log.read_text(errors="replace") if log.exists() else ""
        found = _CBC_PROGRESS.findall(text)
        if found and found[-1] != reported:
            reported = found[-1]
            values = [float(v) for v in reported]
            incumbent, bound = (v if math.isfinite(v) and abs(v) < 1e49 else None for v in values)
            progress(time.perf_counter() - start, incumbent, bound)


def _pulp_problem(milp: SparseMilp) -> tuple[pulp.LpProblem, list[pulp.LpVariable]]:
    """The model as a PuLP problem over variables x0..x{n-1}."""
    import pulp

    problem = pulp.LpProblem("checkmate", pulp.LpMinimize)
    variables = [
        pulp.LpVariable(
            f"x{j}",
            lowBound=lo,
            upBound=None if math.isinf(up) else up,
            cat=pulp.LpInteger if integer else pulp.LpContinuous,
        )
        for j, (lo, up, integer) in enumerate(zip(milp.col_lower, milp.col_upper, milp.integer, strict=True))
    ]
    problem += pulp.LpAffineExpression([(variables[j], c) for j, c in enumerate(milp.cost) if c])
    matrix = milp.matrix
    for row, (lower, upper) in enumerate(zip(milp.row_lower, milp.row_upper, strict=True)):
        span = slice(matrix.indptr[row], matrix.indptr[row + 1])
        expression = pulp.LpAffineExpression(
            [(variables[j], v) for j, v in zip(matrix.indices[span], matrix.data[span], strict=True)]
        )
        if lower == upper:
            problem += expression == lower, f"r{row}"
            continue
        if math.isfinite(lower):
            problem += expression >= lower, f"r{row}l"
        if math.isfinite(upper):
            problem += expression <= upper, f"r{row}u"
    return problem, variables


def _cbc_outcome(problem: pulp.LpProblem, variables: list[pulp.LpVariable], log: str) -> MilpOutcome:
    """Status, solution and bound of a finished CBC run, the bound read from CBC's log."""
    import pulp

    if problem.status == pulp.LpStatusInfeasible or "Result - Problem proven infeasible" in log:
        return MilpOutcome(None, SolveStatus.INFEASIBLE, None)
    has_solution = problem.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    x = np.array([v.varValue or 0.0 for v in variables]) if has_solution else None
    optimal = "Result - Optimal solution found" in log
    match = re.search(r"^Lower bound:\s*(\S+)", log, re.MULTILINE)
    objective = re.search(r"^Objective value:\s*(\S+)", log, re.MULTILINE)
    bound = float(match.group(1)) if match else float(objective.group(1)) if optimal and objective else None
    if x is None and not optimal and problem.status not in (pulp.LpStatusNotSolved, pulp.LpStatusOptimal):
        raise SolverError(f"CBC ended with status {pulp.LpStatus[problem.status]}")
    interrupted = "Result - Stopped on ctrl-c" in log
    status = SolveStatus.OPTIMAL if optimal else SolveStatus.INTERRUPTED if interrupted else SolveStatus.TIME_LIMIT
    return MilpOutcome(x, status, bound)
