"""A single-device problem on CP-SAT's retention-interval model (Moccasin's formulation; cpsat_worker.py builds it).

Operator v may be computed up to min(copies, n - v) times: n - v is as many as the MILP's frontier-advancing form allows
(once per stage from stage v on), so at that many the interval model holds every schedule the MILP does, and more (any
order of computations within a stage). An operator computed once (Problem.computed_once) gets one computation, as in the
MILP. At n - v the model is too large to search: the peers' 63-operator U-Net then has 2016 computations (235k
variables, 784k constraints), and CP-SAT was still in its presolve after 3 minutes (measured). Fewer copies make the
model much smaller (Moccasin uses 2), and its optimum then bounds nothing: the portfolio (portfolio.py) uses it for
schedules, and proves optimality with HiGHS or the memory-cut bound. The worker answers with the operators it computes
in execution order, which become a schedule here, every output freed after its last read.
"""

from __future__ import annotations

import math
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Schedule
from onnx_remat.passes.solve.backend import MilpProgress, SolveStatus
from onnx_remat.passes.solve.baselines import schedule_from_stages
from onnx_remat.passes.solve.child import run_worker
from onnx_remat.passes.solve.cpsat import WORKER

OBJECTIVE_STEPS = 1e9
"""The costliest operator's cost in CP-SAT's integer units (costs round down): a cost error under 1e-9 of it per
computation, far below the solve's optimality gap."""

LIGHT_PRESOLVE = {"max_presolve_iterations": 1, "cp_model_probing_level": 0}
"""CP-SAT's presolve in one pass and without probing: its default (3 passes, probing) took 0.8-1.1 s of the 41-operator
chains' first search, before any solution. The interval model at 2 computations per operator, each problem alone,
default -> light (search start, optimum): chain40_b40 1.08 -> 0.40 s, 1.45 -> 0.79 s; chain40_p80 0.86 -> 0.24,
1.00 -> 0.44; unet4_p60 0.55 -> 0.18, 1.21 -> 0.75; unet4_b40 0.55 -> 0.19, 0.74 -> 0.37; chain40_p60's optimum
2.6-3.4 s -> 2.3-4.0 s; chain40_p40's best in 40 s (346.441) at 21.0 s -> 5.2 s (measured, load 6-8)."""


@dataclass(frozen=True)
class IntervalOutcome:
    """The best schedule the interval model found (or None) and how its search ended (OPTIMAL: within its copies)."""

    schedule: Schedule | None
    status: SolveStatus


def problem_arrays(
    problem: Problem, copies: int, hint: Schedule | None, seconds: float | None, stall: float | None = None
) -> dict[str, np.ndarray]:
    """The arrays the worker builds the interval model from, with CP-SAT's parameters and its search's stall rule
    (`stall`: see solve_intervals)."""
    n, costs = problem.num_ops, np.array(problem.cost[0], dtype=float)
    scale = OBJECTIVE_STEPS / max(float(costs.max(initial=0.0)), 1e-300)
    parameters = {"num_workers": 2, "random_seed": 0, "max_time_in_seconds": 1e9 if seconds is None else seconds,
                  **LIGHT_PRESOLVE}
    allowed = np.minimum(copies, n - np.arange(n)).astype(np.int64)
    allowed[list(problem.computed_once)] = 1
    return {
        "copies": allowed,
        "costs": np.floor(costs * scale).astype(np.int64),
        "sizes": np.array(problem.output_bytes, dtype=np.int64),
        "workspace": np.array(problem.workspace_bytes, dtype=np.int64),
        "capacity": np.array(problem.budgets[0] - problem.resident_bytes[0] - problem.kept_of(0, range(n)),
                             dtype=np.int64),
        "kept": np.array(problem.kept_bytes[0], dtype=np.int64),
        "edges": np.array(problem.edges, dtype=np.int64).reshape(-1, 2),
        "outputs": np.array(problem.graph_outputs, dtype=np.int64),
        "hint": np.array([(c.op, c.stage) for c in hint.computes] if hint else [], dtype=np.int64).reshape(-1, 2),
        "parameter_names": np.array(list(parameters)),
        "parameter_values": np.array(list(parameters.values()), dtype=float),
        "wall_deadline": np.array(math.inf if seconds is None else time.time() + seconds),
        "stall_seconds": np.array(math.nan if stall is None else stall),
    }


def solve_intervals(
    problem: Problem,
    copies: int,
    time_limit: float | None = None,
    hint: Schedule | None = None,
    progress: MilpProgress | None = None,
    stop: threading.Event | None = None,
    stall: float | None = None,
) -> IntervalOutcome:
    """The cheapest schedule of `problem` (one device) with at most `copies` computations per operator that CP-SAT
    finds within `time_limit` seconds or until `stop`; `progress` gets incumbents in seconds (bounds: None). With
    `stall` the search also ends once its incumbent has not improved for as long as finding it took, and `stall`
    seconds at least (cpsat_worker.solve_intervals)."""
    if problem.num_devices != 1:
        raise ValueError("the interval model is single-device: solve several devices with the MILP")
    arrays = problem_arrays(problem, copies, hint, time_limit, stall)
    stop = stop or threading.Event()
    with tempfile.TemporaryDirectory() as directory:
        given, answer = Path(directory) / "problem.npz", Path(directory) / "answer.npz"
        np.savez(given, **arrays)  # type: ignore[arg-type]  # numpy's stubs match **kwds to allow_pickle
        if not run_worker(WORKER, [str(given), str(answer)], answer, _reporter(problem, arrays, progress), stop,
                          "CP-SAT"):
            return IntervalOutcome(None, SolveStatus.INTERRUPTED)
        with np.load(answer) as found:
            status, steps = str(found["status"]), found["values"].tolist()
    if status == "INFEASIBLE":
        return IntervalOutcome(None, SolveStatus.INFEASIBLE)
    schedule = schedule_of(problem, steps) if status in ("OPTIMAL", "FEASIBLE") else None
    if status == "OPTIMAL":
        return IntervalOutcome(schedule, SolveStatus.OPTIMAL)
    return IntervalOutcome(schedule, SolveStatus.INTERRUPTED if stop.is_set() else SolveStatus.TIME_LIMIT)


def schedule_of(problem: Problem, steps: Sequence[int]) -> Schedule:
    """The schedule computing `steps` in order: stage t ends with operator t's first computation, and computations
    after the last one's join the last stage."""
    stages: list[list[int]] = [[] for _ in range(problem.num_ops)]
    frontier = 0
    for op in steps:
        stages[min(frontier, problem.num_ops - 1)].append(op)
        frontier += op == frontier
    return schedule_from_stages(problem, stages)


def _reporter(problem: Problem, arrays: dict[str, np.ndarray], progress: MilpProgress | None) -> Callable[[str], None]:
    """Parse the worker's "incumbent bound" lines into `progress` calls: the incumbent in seconds, no bound (within
    fewer copies than exact, CP-SAT's bound bounds nothing)."""
    start = time.perf_counter()
    costs = np.array(problem.cost[0], dtype=float)
    first = float(costs.sum())
    unit = float(costs.max(initial=0.0)) / OBJECTIVE_STEPS

    def report(line: str) -> None:
        incumbent = float(line.split()[0])
        if progress is not None and math.isfinite(incumbent):
            progress(time.perf_counter() - start, first + incumbent * unit, None)

    return report

