"""The single-device solver: Checkmate's MILP on a chosen backend, never worse than the baselines.

`solve(problem)` builds the MILP, warm-starts it with the cheapest baseline that fits, runs the
backend and checks the schedule it returns with the simulator before handing it out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from onnx_remat.errors import InfeasibleBudgetError, SolverError, UsageError
from onnx_remat.passes.simulate import check_schedule
from onnx_remat.passes.solve.baselines import best_baseline, prune_unread
from onnx_remat.passes.solve.checkmate_milp import (
    CheckmateModel,
    MilpOutcome,
    MilpProgress,
    build_model,
    solve_cbc,
    solve_highs,
)
from onnx_remat.passes.solve.min_budget import minimum_budget, quick_lower_bound
from onnx_remat.problem import Problem
from onnx_remat.schedule import Schedule

Progress = Callable[[float, float | None, float | None], None]
"""(elapsed seconds, incumbent predicted seconds or None, lower bound or None)."""

BACKENDS: dict[str, Callable[..., MilpOutcome]] = {"highs": solve_highs, "cbc": solve_cbc}


@dataclass(frozen=True)
class SolveResult:
    """A checked schedule, how the solver ended ("optimal", "time_limit", "heuristic") and its bound."""

    schedule: Schedule
    status: str
    objective: float
    bound: float
    gap: float
    seconds: float
    solver: str
    model_objective: float
    """The cost in the MILP's frontier-advancing form, before pruning unread computations, which
    `objective` (the returned schedule's cost) never exceeds; `bound` is a bound on that form."""


def solve(
    problem: Problem, solver: str = "highs", time_limit: float | None = None, progress: Progress | None = None
) -> SolveResult:
    """The cheapest schedule within device 0's budget that `solver` finds within `time_limit` seconds."""
    if solver not in BACKENDS:
        raise UsageError(f"unknown solver {solver!r}: choose one of {', '.join(BACKENDS)}")
    if problem.num_devices != 1:
        raise UsageError(f"the single-device solver got {problem.num_devices} devices: give it one")
    start = time.perf_counter()
    lower = quick_lower_bound(problem)
    if problem.budgets[0] < lower:
        raise InfeasibleBudgetError(
            f"budget {problem.budgets[0]} bytes is below {lower} bytes, what a single step or the outputs need", lower
        )
    baseline = best_baseline(problem)
    model = build_model(problem)
    warm = None if baseline is None else model.assignment(baseline[1])
    remaining = None if time_limit is None else max(0.01, time_limit - (time.perf_counter() - start))
    outcome = BACKENDS[solver](model.milp, remaining, warm, _scaled(progress, model, start))
    bound = None if outcome.bound is None else outcome.bound * model.objective_unit
    schedule, status = _pick(problem, model, outcome, baseline)
    model_objective = check_schedule(problem, schedule).total_cost
    schedule = prune_unread(problem, schedule)
    return _result(problem, schedule, status, bound, model_objective, time.perf_counter() - start, solver)


def _scaled(progress: Progress | None, model: CheckmateModel, start: float) -> MilpProgress | None:
    """A backend progress callback reporting wall time since `start` and values in seconds."""
    if progress is None:
        return None

    def report(_: float, incumbent: float | None, bound: float | None) -> None:
        unit = model.objective_unit
        progress(
            time.perf_counter() - start,
            None if incumbent is None else incumbent * unit,
            None if bound is None else bound * unit,
        )

    return report


def _pick(
    problem: Problem, model: CheckmateModel, outcome: MilpOutcome, baseline: tuple[str, Schedule] | None
) -> tuple[Schedule, str]:
    """The solver's schedule unless a baseline is cheaper or the solver found none."""
    if outcome.x is not None:
        schedule = model.schedule(outcome.x)
        cost = check_schedule(problem, schedule).total_cost
        if baseline is None or cost <= check_schedule(problem, baseline[1]).total_cost:
            return schedule, outcome.status
        return baseline[1], outcome.status
    if baseline is not None:
        return baseline[1], "heuristic"
    if outcome.status == "infeasible":
        minimum = minimum_budget(problem).feasible
        raise InfeasibleBudgetError(
            f"budget {problem.budgets[0]} bytes admits no schedule: the minimum is {minimum} bytes", minimum
        )
    raise SolverError("the solver found no schedule within the time limit and no baseline fits the budget")


def _result(
    problem: Problem,
    schedule: Schedule,
    status: str,
    bound: float | None,
    model_objective: float,
    seconds: float,
    solver: str,
) -> SolveResult:
    """Check `schedule` and state its cost with a bound clamped to [sum of costs, objective]."""
    objective = check_schedule(problem, schedule).total_cost
    bound = min(max(bound if bound is not None else 0.0, sum(problem.cost[0])), objective)
    gap = (objective - bound) / objective if objective > 0 else 0.0
    return SolveResult(schedule, status, objective, bound, gap, seconds, solver, model_objective)
