"""A single-device portfolio: HiGHS on the MILP's stage relaxation (lazy.py) and CP-SAT on the retention-interval model
(interval.py).

On the peers benchmark's problems the two are strong at different things: CP-SAT on intervals finds the optimum of a
37-operator U-Net at half its keep-all memory in 9 s, where HiGHS takes 262 s to find and prove it; HiGHS proves what
the memory-cut bound cannot. CP-SAT searches first, on both cores (two workers), until its incumbent stalls (STALL), or
at HAND_OVER of the time limit on the wall clock; where HiGHS runs in this process (small models) it runs beside it,
where it runs in a child (larger ones) it starts then, from the cheaper of the warm start and CP-SAT's schedule, and has
the processor to itself. Beside CP-SAT at nice 19 (as before) HiGHS's child got 0.5 CPU s of chain40_p40's first 10 s
and too little of the rest once other work loaded the machine: nice only goes up, so it could not be given the processor
back.
HiGHS solves the MILP with each stage's memory followed only where its schedules need it (lazy.py): a smaller model
whose bound holds for the MILP, proven faster. Both stop at the first proof: HiGHS optimal (or infeasible), CP-SAT
optimal with as many computations per operator as the MILP allows (then its model is the MILP's form), or CP-SAT's
incumbent meeting the memory-cut bound (proven.py, which the caller wires into the progress callbacks); the caller
keeps the cheapest schedule. HiGHS reports its bound only: the relaxation's incumbents may exceed the budget.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Schedule
from onnx_remat.passes.simulate import check_schedule
from onnx_remat.passes.solve.backend import MilpProgress, SolveStatus, SparseMilp
from onnx_remat.passes.solve.checkmate_milp import CheckmateModel
from onnx_remat.passes.solve.highs import IN_PROCESS_NONZEROS, STREAMED_GRACE
from onnx_remat.passes.solve.interval import IntervalOutcome, solve_intervals
from onnx_remat.passes.solve.lazy import LazyOutcome, solve_lazily

COPIES = 3
"""Computations per operator in the interval model (Moccasin's default is 2). At half the keep-all memory: a 37-operator
U-Net's optimum in 9 s with 3, 15 s with 4; a 16-operator training chain's in 0.9 s with 3; a 16-operator U-Net needs
more than 4 (HiGHS proves it). Measured; more make the model slower, and the MILP covers what they would add. The peers'
unet4_p40's optimum (87.349, which HiGHS alone proved in 852 s) computes an operator 4 times: alone for 60 s CP-SAT
ends at 87.400 with 3, finds 87.349 at 48 s with 4 and at 44 s with 5; in the portfolio 4 reached 88.957 by the
hand-over (31 s) and 87.832 in all, against 87.400 with 3 (load 9, measured)."""
HEAD_START = 2.0
"""Longest wait, in seconds, for the CP-SAT worker to report before HiGHS starts in this process (_head_start). It
reports at once after loading its model when hinted, 0.5-0.7 s after starting alone; beside HiGHS it took 2.6 s under
load (chain20_p60, measured)."""
STALL = 10.0
"""Shortest stall, in CPU seconds of the CP-SAT worker (two threads), that ends its search on the interval model where
it is not exact: it then proves nothing, and past its last improvement it holds the processor HiGHS needs for its
proof. It ends once its incumbent has not improved for as long as finding it took, and STALL at least. chain40_p40
at a 240 s limit under load 9-10: CP-SAT stalled after 18.8 CPU s (346.906), HiGHS from its schedule proved 346.441
optimal at 165 s; beside CP-SAT at nice 19 HiGHS got 4.8 CPU s in 232 s and proved nothing (measured)."""
HAND_OVER = 0.5
"""Share of the time limit, on the wall clock, after which CP-SAT's search on the interval model ends where it is not
exact, stalled or not: HiGHS then has the rest. Under heavy load STALL, counted in the worker's CPU seconds, may not
pass within the limit at all (load 5-21 on 2 cores: HiGHS's child never started on the peers' unet4_p40, and the
stated bound fell back to the memory-cut bound)."""


@dataclass(frozen=True)
class Race:
    """What each side of the portfolio found; `exact`: the interval model had as many computations per operator as
    the MILP allows, so its optimum is the MILP's."""

    milp: LazyOutcome
    intervals: IntervalOutcome
    exact: bool


def race(
    problem: Problem,
    time_limit: float | None,
    warm: Schedule | None,
    reports: tuple[MilpProgress | None, MilpProgress | None],
    gaps: tuple[float, float],
    stop: threading.Event,
) -> Race:
    """Run CP-SAT on the interval model (in a thread) and HiGHS on the MILP's stage relaxation (here) until both end;
    `stop` is set once one proves optimality (or infeasibility), which ends the other. HiGHS in this process runs
    beside CP-SAT; in its child (a larger model) once CP-SAT's search has ended, from the cheaper of `warm` (a schedule
    within the budget) and CP-SAT's schedule. `reports` are HiGHS's progress callback (its bound) and the interval
    model's, both in seconds."""
    copies = min(COPIES, problem.num_ops)
    exact = copies >= problem.num_ops
    found: list[IntervalOutcome] = []
    failed: list[BaseException] = []
    reporting = threading.Event()

    def report(seconds: float, incumbent: float | None, bound: float | None) -> None:
        reporting.set()
        if reports[1] is not None:
            reports[1](seconds, incumbent, bound)

    def intervals() -> None:
        try:
            outcome = solve_intervals(problem, copies, _searched(time_limit, exact), warm, report, stop,
                                      None if exact else STALL)
        except BaseException as error:  # raised again in the caller's thread
            failed.append(error)
            return
        finally:
            reporting.set()
        if exact and outcome.status in (SolveStatus.OPTIMAL, SolveStatus.INFEASIBLE):
            stop.set()
        found.append(outcome)

    thread = threading.Thread(target=intervals, daemon=True)
    thread.start()
    try:
        outcome = solve_lazily(problem, time_limit, _starts(problem, warm, stop, (thread, found, reporting)),
                               reports[0], gaps, stop, STREAMED_GRACE)
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


def _searched(time_limit: float | None, exact: bool) -> float | None:
    """Seconds CP-SAT's search on the interval model may take: all of `time_limit` where the model is `exact` (its
    proof ends the race), HAND_OVER of it where not."""
    return time_limit if exact or time_limit is None else HAND_OVER * time_limit


def _starts(
    problem: Problem,
    warm: Schedule | None,
    stop: threading.Event,
    cpsat: tuple[threading.Thread, list[IntervalOutcome], threading.Event],
) -> Callable[[CheckmateModel], Schedule | None]:
    """HiGHS's start for each relaxation it solves, chosen when it is about to: where HiGHS runs in this process, `warm`
    as soon as CP-SAT has reported; where it runs in a child, once CP-SAT's search has ended (or `stop` is set), the
    cheaper of `warm` and CP-SAT's schedule."""
    thread, found, reporting = cpsat

    def start(model: CheckmateModel) -> Schedule | None:
        if model.milp.matrix.nnz <= IN_PROCESS_NONZEROS:
            _head_start(reporting, stop)
            return warm
        _until_ended(thread, stop)
        schedule = found[0].schedule if found else None
        return _cheapest_start(problem, model, (warm, schedule))

    return start


def _until_ended(thread: threading.Thread, stop: threading.Event) -> None:
    """Wait until the CP-SAT worker's thread ends (its search stalled, proved, or ran out of time) or `stop` is set."""
    while thread.is_alive() and not stop.is_set():
        thread.join(0.05)


def _cheapest_start(
    problem: Problem, model: CheckmateModel, schedules: tuple[Schedule | None, Schedule | None]
) -> Schedule | None:
    """The cheaper of two schedules within the budget whose solution vectors satisfy `model`'s rows (an interval
    schedule computes within a stage in any order, which the MILP may not), or None."""
    admitted = [s for s in schedules if s is not None and _satisfies(model.milp, model.assignment(s))]
    return min(admitted, key=lambda s: check_schedule(problem, s).total_cost, default=None)


def _satisfies(milp: SparseMilp, x: np.ndarray, tolerance: float = 1e-6) -> bool:
    """Whether `x` is within the MILP's column and row bounds, to `tolerance` relative to each row's activity."""
    rows = milp.matrix.dot(x)
    slack = tolerance * (1.0 + np.abs(rows))
    within_rows = np.all(rows >= milp.row_lower - slack) and np.all(rows <= milp.row_upper + slack)
    within_columns = np.all(x >= milp.col_lower - tolerance) and np.all(x <= milp.col_upper + tolerance)
    return bool(within_rows and within_columns)


def _head_start(reporting: threading.Event, stop: threading.Event) -> None:
    """Wait until the CP-SAT worker reports (it has started and loaded its model), ends, or HEAD_START seconds pass,
    or `stop` is set (Ctrl-C, a proof): its start-up, a Python importing OR-Tools, is slowed most by HiGHS's threads."""
    deadline = time.perf_counter() + HEAD_START
    while not (reporting.is_set() or stop.is_set()) and time.perf_counter() < deadline:
        reporting.wait(0.05)
