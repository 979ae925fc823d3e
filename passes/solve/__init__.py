"""The solver: Checkmate's MILP on any number of devices, on a chosen backend, never worse than the baselines.

`solve(problem)` builds the MILP, warm-starts it with the cheapest single-device schedule that fits
(a baseline with one device; each device solved alone with several), runs the backend and checks the
schedule it returns with the simulator before handing it out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from onnx_remat.errors import InfeasibleBudgetError, SolverError, UsageError
from onnx_remat.passes.simulate import check_schedule
from onnx_remat.passes.solve.baselines import best_baseline, on_device, placed, prune_unread
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
    """The cheapest schedule within every device's budget that `solver` finds within `time_limit` seconds.

    With several devices each device is first solved alone (the others unused, a quarter of the time
    limit in all); the best of those warm-starts the multi-device MILP, so the result is never
    predicted slower than the best single-device schedule (both in the MILP's frontier-advancing form).
    """
    if solver not in BACKENDS:
        raise UsageError(f"unknown solver {solver!r}: choose one of {', '.join(BACKENDS)}")
    start = time.perf_counter()
    _refuse_small_budgets(problem)
    schedule, status, bound = _solve_frontier(problem, solver, time_limit, progress)
    if schedule is None:
        _no_schedule(problem, status)
    model_objective = _cost(problem, schedule)
    schedule = prune_unread(problem, schedule)
    return _result(problem, schedule, status, bound, model_objective, time.perf_counter() - start, solver)


def _refuse_small_budgets(problem: Problem) -> None:
    """Raise InfeasibleBudgetError if a device's budget is below its quick lower bound."""
    for device, budget in enumerate(problem.budgets):
        lower = quick_lower_bound(problem, device)
        if budget < lower:
            where = f"device {problem.devices[device]}: " if problem.num_devices > 1 else ""
            raise InfeasibleBudgetError(
                f"{where}budget {budget} bytes is below {lower} bytes, what a single step or the outputs need", lower
            )


def _solve_frontier(
    problem: Problem, solver: str, time_limit: float | None, progress: Progress | None
) -> tuple[Schedule | None, str, float | None]:
    """The best schedule in the MILP's frontier-advancing form (or None), the status and a bound in seconds."""
    start = time.perf_counter()
    incumbent = _incumbent(problem, solver, time_limit)
    model = build_model(problem)
    warm = None if incumbent is None else model.assignment(incumbent)
    remaining = None if time_limit is None else max(0.01, time_limit - (time.perf_counter() - start))
    outcome = BACKENDS[solver](model.milp, remaining, warm, _scaled(progress, model, start))
    bound = None if outcome.bound is None else outcome.bound * model.objective_unit
    return *_pick(problem, model, outcome, incumbent), bound


def _incumbent(problem: Problem, solver: str, time_limit: float | None) -> Schedule | None:
    """The best single-device schedule that fits: a baseline with one device, each device solved alone with more."""
    if problem.num_devices == 1:
        baseline = best_baseline(problem)
        return None if baseline is None else baseline[1]
    share = None if time_limit is None else time_limit / (4 * problem.num_devices)
    found = []
    for device in range(problem.num_devices):
        single = on_device(problem, device)
        if problem.budgets[device] >= quick_lower_bound(single):
            schedule = _solve_frontier(single, solver, share, None)[0]
            found.extend([] if schedule is None else [placed(schedule, device)])
    return min(found, key=lambda schedule: _cost(problem, schedule), default=None)


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
    problem: Problem, model: CheckmateModel, outcome: MilpOutcome, incumbent: Schedule | None
) -> tuple[Schedule | None, str]:
    """The solver's schedule unless the incumbent is cheaper or the solver found none."""
    if outcome.x is not None:
        schedule = model.schedule(outcome.x)
        if incumbent is None or _cost(problem, schedule) <= _cost(problem, incumbent):
            return schedule, outcome.status
        return incumbent, outcome.status
    return incumbent, "heuristic" if incumbent is not None else outcome.status


def _cost(problem: Problem, schedule: Schedule) -> float:
    """The predicted seconds of a schedule within the budgets."""
    return check_schedule(problem, schedule).total_cost


def _no_schedule(problem: Problem, status: str) -> NoReturn:
    """Raise why no schedule was found: the budgets are proven too small, or time ran out."""
    if status != "infeasible":
        raise SolverError("the solver found no schedule within the time limit and no baseline fits the budget")
    if problem.num_devices == 1:
        minimum = minimum_budget(problem).feasible
        raise InfeasibleBudgetError(
            f"budget {problem.budgets[0]} bytes admits no schedule: the minimum is {minimum} bytes", minimum
        )
    minima = ", ".join(
        f"{name} {minimum_budget(problem, device).feasible}" for device, name in enumerate(problem.devices)
    )
    raise InfeasibleBudgetError(
        f"budgets {problem.budgets} bytes admit no schedule; each device's minimum with the others at their "
        f"budgets: {minima} bytes"
    )


def _result(
    problem: Problem,
    schedule: Schedule,
    status: str,
    bound: float | None,
    model_objective: float,
    seconds: float,
    solver: str,
) -> SolveResult:
    """Check `schedule` and state its cost with a bound clamped to [sum of cheapest costs, objective]."""
    objective = check_schedule(problem, schedule).total_cost
    cheapest = sum(min(costs) for costs in zip(*problem.cost, strict=True))
    bound = min(max(bound if bound is not None else 0.0, cheapest), objective)
    gap = (objective - bound) / objective if objective > 0 else 0.0
    return SolveResult(schedule, status, objective, bound, gap, seconds, solver, model_objective)
