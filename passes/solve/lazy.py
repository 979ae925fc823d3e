"""HiGHS on the MILP with each stage's memory followed only where a schedule needs it (one device).

The MILP follows memory at every position of every stage (U and FREE: over half its columns and most of its rows).
Left with only each stage's knapsack row (checkmate_milp._stage_knapsack_row: what is held into the next stage beside
the stage's own operator, its inputs and workspace), it is a relaxation: every schedule in the frontier-advancing
form within the budget satisfies it (with nothing held that is not read later), so its optimum bounds theirs. Where
the relaxation's optimal schedule also fits the budget when replayed, it is optimal; where it does not, the stages it
exceeds the budget in are followed position by position and the relaxation solved again (each time it is tighter, and
with every stage followed it is the MILP itself).

On the peers benchmark's problems the first relaxation's optimum fits on all it was tried on, and is proven faster:
unet4_p40 (87.349) in 86-106 s against 852 s for the MILP (1 thread), chain40_p40 in 19 s at load 10 (measured).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute, Schedule
from onnx_remat.passes.simulate import check_schedule, simulate
from onnx_remat.passes.solve.backend import MilpProgress, SolveStatus
from onnx_remat.passes.solve.checkmate_milp import CheckmateModel, build_model
from onnx_remat.passes.solve.highs import solve_highs

Start = Callable[[CheckmateModel], Schedule | None]
"""The schedule to start a relaxation's search from (one within the budget), given its model."""


@dataclass(frozen=True)
class LazyOutcome:
    """The cheapest schedule within the budget found (or None), how the search ended (OPTIMAL: that schedule is
    optimal in the frontier-advancing form) and the proven bound in seconds (None: none)."""

    schedule: Schedule | None
    status: SolveStatus
    bound: float | None


def solve_lazily(
    problem: Problem,
    time_limit: float | None,
    start: Start,
    report: MilpProgress | None,
    gaps: tuple[float, float],
    stop: threading.Event,
    grace: float,
) -> LazyOutcome:
    """Solve the relaxation with the stages its schedules exceed the budget in followed, until one fits or time
    runs out (see the module docstring). `report` gets HiGHS's bound in seconds, never its incumbents: those may
    exceed the budget. `grace`: seconds HiGHS's child has to answer after a stop (highs.solve_highs)."""
    began = time.perf_counter()
    followed: set[int] = set()
    bound: float | None = None
    while True:
        model = build_model(problem, stages=followed)
        warm = start(model)
        if stop.is_set():  # during the start's wait (the portfolio's CP-SAT proved, or time ran out): HiGHS not run
            return LazyOutcome(warm, SolveStatus.INTERRUPTED, bound)
        left = None if time_limit is None else max(0.01, time_limit - (time.perf_counter() - began))
        outcome = solve_highs(model.milp, left, None if warm is None else model.assignment(warm),
                              _bound_only(report, model.objective_unit), gaps, stop, grace=grace)
        if outcome.bound is not None:
            proven = outcome.bound * model.objective_unit
            bound = proven if bound is None else max(bound, proven)
        if outcome.status == SolveStatus.INFEASIBLE:
            return LazyOutcome(None, SolveStatus.INFEASIBLE, None)
        found = None if outcome.x is None else model.schedule(outcome.x)
        over = set() if found is None else over_budget(problem, found)
        if found is not None and not over:
            return LazyOutcome(_cheaper(problem, found, warm), outcome.status, bound)
        if outcome.status != SolveStatus.OPTIMAL or followed >= over:
            return LazyOutcome(warm, _unproven(outcome.status), bound)
        followed |= over


def over_budget(problem: Problem, schedule: Schedule) -> set[int]:
    """The stages in which `schedule` (one device) exceeds the budget when replayed."""
    trace = simulate(problem, schedule).memory_trace[0]
    budget = problem.budgets[0]
    return {
        event.stage
        for event, memory in zip(schedule.events, trace, strict=True)
        if isinstance(event, Compute) and memory + problem.workspace_bytes[event.op] > budget
    }


def _cheaper(problem: Problem, found: Schedule, warm: Schedule | None) -> Schedule:
    """The cheaper of two schedules within the budget (`found` on a tie)."""
    if warm is None:
        return found
    return warm if check_schedule(problem, warm).total_cost < check_schedule(problem, found).total_cost else found


def _unproven(status: SolveStatus) -> SolveStatus:
    """A relaxation's status, where its schedule was not the answer: stopped as it was, or out of time."""
    return status if status in (SolveStatus.INTERRUPTED, SolveStatus.TIME_LIMIT) else SolveStatus.TIME_LIMIT


def _bound_only(report: MilpProgress | None, unit: float) -> MilpProgress | None:
    """A HiGHS progress callback passing on its bound in seconds, and no incumbent."""
    if report is None:
        return None

    def bound_only(seconds: float, _: float | None, bound: float | None) -> None:
        report(seconds, None, None if bound is None else bound * unit)

    return bound_only
