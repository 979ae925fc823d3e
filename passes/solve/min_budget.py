"""The smallest budget any schedule fits in: a quick lower bound and the peak-minimizing MILP.

The CLI states this number when it refuses a budget, so a user knows what to ask for instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnx_remat.passes.simulate import simulate
from onnx_remat.passes.solve.baselines import BASELINES
from onnx_remat.passes.solve.checkmate_milp import build_model, solve_highs
from onnx_remat.problem import Problem
from onnx_remat.schedule import Schedule


@dataclass(frozen=True)
class MinBudget:
    """`lower` <= the minimum budget <= `feasible` bytes (a schedule peaks at `feasible`); equal when proven."""

    lower: int
    feasible: int


def quick_lower_bound(problem: Problem, device: int = 0) -> int:
    """A bound no schedule beats: the largest single step, its last input's production, or all outputs.

    When operator v runs, its inputs and output are held. Earlier, when the last of its inputs p was
    computed, the other inputs of v, p's own inputs, p and p's workspace were all held at once.
    """
    sizes, preds = problem.output_bytes, problem.predecessors

    def held(ops: set[int]) -> int:
        return sum(sizes[op] for op in ops)

    def step(v: int) -> int:
        running = held({v, *preds[v]}) + problem.workspace_bytes[v]
        last_input = min((held({p, *preds[v], *preds[p]}) + problem.workspace_bytes[p] for p in preds[v]), default=0)
        return max(running, last_input)

    steps = max((step(v) for v in range(problem.num_ops)), default=0)
    return problem.resident_bytes[device] + max(steps, held(set(problem.graph_outputs)))


def minimum_budget(problem: Problem, device: int = 0, time_limit: float = 10.0) -> MinBudget:
    """The minimum budget on `device`, proven by HiGHS minimizing the peak unless `time_limit` runs out."""
    if problem.num_ops == 0:
        return MinBudget(problem.resident_bytes[device], problem.resident_bytes[device])
    lower = quick_lower_bound(problem, device)
    peak, schedule = min(
        ((_peak(problem, schedule, device), schedule) for schedule in (build(problem) for build in BASELINES.values())),
        key=lambda pair: pair[0],
    )
    if peak == lower:
        return MinBudget(lower, peak)
    model = build_model(problem, device, peak_range=(lower, peak))
    outcome = solve_highs(
        model.milp, time_limit, model.assignment(schedule), gaps=(0.0, 0.5 / model.memory_unit)
    )
    if outcome.x is not None:
        peak = min(peak, _peak(problem, model.schedule(outcome.x), device))
    if outcome.status == "optimal":
        return MinBudget(peak, peak)
    if outcome.bound is not None:
        lower = max(lower, math.ceil(outcome.bound * model.memory_unit - 0.5))
    return MinBudget(min(lower, peak), peak)


def _peak(problem: Problem, schedule: Schedule, device: int) -> int:
    """The simulated peak of `schedule` on `device` (budgets do not matter here)."""
    return simulate(problem, schedule).peak_bytes[device]
