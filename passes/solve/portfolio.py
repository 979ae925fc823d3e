"""A single-device portfolio: HiGHS on the MILP and CP-SAT on the retention-interval model (interval.py), at once.

On the peers benchmark's problems the two are strong at different things: CP-SAT on intervals finds the optimum of
a 37-operator U-Net at half its keep-all memory in 9 s, where HiGHS takes 262 s to find and prove it; HiGHS proves
what the memory-cut bound cannot. Each runs in its own process or thread, so together they use both cores. Both
stop at the first proof: HiGHS optimal (or infeasible), CP-SAT optimal with as many computations per operator as the
MILP allows (then its model is the MILP's form), or either's incumbent meeting the memory-cut bound (proven.py,
which the caller wires into the progress callbacks); the caller keeps the cheapest schedule.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from onnx_remat.passes.solve.backend import MilpOutcome, MilpProgress, SolveStatus, SparseMilp
from onnx_remat.passes.solve.highs import solve_highs
from onnx_remat.passes.solve.interval import IntervalOutcome, solve_intervals
from onnx_remat.problem import Problem
from onnx_remat.schedule import Schedule

COPIES = 3
"""Computations per operator in the interval model (Moccasin's default is 2). At half the keep-all memory: a 37-operator
U-Net's optimum in 9 s with 3, 15 s with 4; a 16-operator training chain's in 0.9 s with 3; a 16-operator U-Net needs
more than 4 (HiGHS proves it). Measured; more make the model slower, and the MILP covers what they would add."""

@dataclass(frozen=True)
class Race:
    """What each side of the portfolio found; `exact`: the interval model had as many computations per operator as
    the MILP allows, so its optimum is the MILP's."""

    milp: MilpOutcome
    intervals: IntervalOutcome
    exact: bool


def race(
    problem: Problem,
    milp: SparseMilp,
    time_limit: float | None,
    warm: tuple[np.ndarray | None, Schedule | None],
    reports: tuple[MilpProgress | None, MilpProgress | None],
    gaps: tuple[float, float],
    stop: threading.Event,
) -> Race:
    """Run HiGHS on `milp` (here) and CP-SAT on the interval model (in a thread) until both end; `stop` is set once
    one proves optimality (or infeasibility), which ends the other. `warm` is the MILP's warm start and the same
    schedule; `reports` the MILP's progress callback and the interval model's (in seconds)."""
    copies = min(COPIES, problem.num_ops)
    exact = copies >= problem.num_ops
    found: list[IntervalOutcome] = []
    failed: list[BaseException] = []

    def intervals() -> None:
        try:
            outcome = solve_intervals(problem, copies, time_limit, warm[1], reports[1], stop)
        except BaseException as error:  # raised again in the caller's thread
            failed.append(error)
            return
        if exact and outcome.status in (SolveStatus.OPTIMAL, SolveStatus.INFEASIBLE):
            stop.set()
        found.append(outcome)

    thread = threading.Thread(target=intervals, daemon=True)
    thread.start()
    try:
        outcome = solve_highs(milp, time_limit, warm[0], reports[0], gaps, stop)
    except BaseException:
        stop.set()
        thread.join()
        raise
    if outcome.status in (SolveStatus.OPTIMAL, SolveStatus.INFEASIBLE):
        stop.set()
    thread.join()
    if failed:
        raise failed[0]
    return Race(outcome, found[0], exact)
