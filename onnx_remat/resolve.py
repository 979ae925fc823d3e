"""Budgets resolved against a problem: each device's keep-all and minimum, the minimum searched once per problem.

Every caller that turns budgets as the user wrote them (`25%`, `min`, bytes) into bytes goes through
`resolve_budgets`: the pipeline at every budget of a sweep or batch, and the `solve` command for a problem file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from onnx_remat.core.budget import Budget, below_minimum, format_bytes
from onnx_remat.core.errors import InfeasibleBudgetError
from onnx_remat.core.options import MINIMUM_SECONDS
from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Schedule
from onnx_remat.passes.solve.min_budget import MinBudget, minimum_budget, quick_lower_bound


class Minima:
    """The minimum budgets of one problem's devices, each searched once per budgets of the other devices (with one
    device: once), and again only by a longer search when the first proved nothing; `slowdown`: how many times slower
    than an idle one the machine runs now (the search's heuristic scales its work bound by it)."""

    def __init__(self, problem: Problem, slowdown: float = 1.0) -> None:
        self.problem, self.slowdown = problem, slowdown
        self._found: dict[tuple[int, tuple[int, ...]], tuple[float, MinBudget]] = {}

    def minimum(self, budgets: Sequence[int], device: int, seconds: float) -> MinBudget:
        """`device`'s minimum budget with the other devices at `budgets`, searched for `seconds` unless known."""
        key = (device, (*budgets[:device], *budgets[device + 1:]))
        known = self._found.get(key)
        if known is None or (known[0] < seconds and known[1].lower < known[1].feasible):
            problem = replace(self.problem, budgets=tuple(budgets))
            self._found[key] = (seconds, minimum_budget(problem, device, seconds, self.slowdown))
        return self._found[key][1]


@dataclass(frozen=True)
class Resolved:
    """Each device's budget in bytes; where searched, its minimum budget's bounds (with the other devices at their
    budgets) and the schedules reaching them, for the solver to start from."""

    budgets: tuple[int, ...]
    minima: tuple[MinBudget | None, ...]
    reached: tuple[Schedule, ...] = ()


HEURISTIC_SEARCH_SHARE = 0.75
"""Share of the time left that the minimum-budget search takes for a `min` budget when the solver has no MILP to run
(too large a problem): its heuristics then need seconds (3.8 s of 60 on DenseNet-121's training step, measured)."""


def search_seconds(seconds_left: float | None, budgets: Sequence[Budget], milp: bool = True) -> float:
    """Time for the minimum-budget search out of the `seconds_left` for it and the solver (None: no limit): when a
    budget is `min` (the answer the user asked for) half, or HEURISTIC_SEARCH_SHARE where the solver runs no `milp`;
    else (a refusal's or the report's figure) at most MINIMUM_SECONDS of half."""
    if seconds_left is None:
        return MINIMUM_SECONDS
    if any(b.minimum for b in budgets):
        return seconds_left * (0.5 if milp else HEURISTIC_SEARCH_SHARE)
    return min(MINIMUM_SECONDS, seconds_left / 2)


def resolve_budgets(minima: Minima, budgets: Sequence[Budget], find_minimum: bool, seconds: float) -> Resolved:
    """Each device's budget in bytes, resolved against its keep-all and minimum, refusing one below its minimum.

    Budgets of `min` are resolved in device order, each with the later `min` devices still at keep-all. With one
    device, an explicit budget and not `find_minimum`, the minimum is searched only if the budget is below a quick
    bound (to state it when refusing), and is None otherwise: the solver then proves a budget infeasible itself."""
    problem = minima.problem
    keep = [problem.keep_all_bytes(d) for d in range(problem.num_devices)]
    requested = [budget.resolve(keep[d], keep[d]) for d, budget in enumerate(budgets)]
    _refuse_below_resident(problem, requested)
    if not find_minimum and problem.num_devices == 1 and not budgets[0].minimum and \
            requested[0] >= quick_lower_bound(problem):
        return Resolved(tuple(requested), (None,))
    found = []
    for d, budget in enumerate(budgets):
        minimum = minima.minimum(requested, d, seconds / problem.num_devices)
        requested[d] = budget.resolve(keep[d], minimum.feasible)
        if requested[d] < minimum.lower or (requested[d] < minimum.feasible and minimum.lower == minimum.feasible):
            raise below_minimum(problem, d, requested[d], minimum.feasible)
        found.append(minimum)
    reached = tuple(m.schedule for m in found if m.schedule is not None)
    return Resolved(tuple(requested), tuple(found), reached)


def _refuse_below_resident(problem: Problem, requested: list[int]) -> None:
    """Refuse budgets that cannot hold what stays on a device all run whatever runs there, when more than one device
    has one (with one, its minimum budget is stated). With several devices parameters and inputs are not in it: a
    device loads only those its operators read (`Problem.loaded`), so a budget below them still parks copies."""
    below = [d for d in range(problem.num_devices) if requested[d] < problem.resident_bytes[d]]
    if len(below) > 1:
        names = ", ".join(f"{problem.devices[d]} {format_bytes(requested[d])}" for d in below)
        raise InfeasibleBudgetError(
            f"budgets {names} are below the {format_bytes(problem.resident_bytes[below[0]])} "
            f"({problem.resident_bytes[below[0]]} bytes) each device holds for the whole run whatever runs there: "
            "raise them"
        )
