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
import time
from dataclasses import dataclass

import numpy as np

from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Schedule
from onnx_remat.passes.solve.backend import MilpOutcome, MilpProgress, SolveStatus, SparseMilp
from onnx_remat.passes.solve.highs import STREAMED_GRACE, solve_highs
from onnx_remat.passes.solve.interval import IntervalOutcome, solve_intervals

COPIES = 3
"""Computations per operator in the interval model (Moccasin's default is 2). At half the keep-all memory: a 37-operator
U-Net's optimum in 9 s with 3, 15 s with 4; a 16-operator training chain's in 0.9 s with 3; a 16-operator U-Net needs
more than 4 (HiGHS proves it). Measured; more make the model slower, and the MILP covers what they would add."""
HEAD_START = 2.0
"""Longest wait, in seconds, for the CP-SAT worker to report before HiGHS starts (_head_start). It reports at once
after loading its model when hinted, 0.5-0.7 s after starting alone; beside HiGHS it took 2.6 s under load (chain20_p60,
measured)."""

HIGHS_NICE = 19
"""How much HiGHS's child yields the processor to CP-SAT's workers (os.nice): on two cores the three searches share
them, and CP-SAT finds the peers' schedules. chain40_p60's optimum in the portfolio 10.7-11.2 s with HiGHS at the
same priority, 6.9-7.4 s at 19 (CP-SAT alone 2.3-4.0 s); unet4_p40's best (87.4) at 20.0 s against 13.4 s (measured
interleaved, load 9-10). Where HiGHS runs in-process (models up to highs.IN_PROCESS_NONZEROS) it keeps its priority."""


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
    reporting = threading.Event()

    def report(seconds: float, incumbent: float | None, bound: float | None) -> None:
        reporting.set()
        if reports[1] is not None:
            reports[1](seconds, incumbent, bound)

    def intervals() -> None:
        try:
            outcome = solve_intervals(problem, copies, time_limit, warm[1], report, stop)
        except BaseException as error:  # raised again in the caller's thread
            failed.append(error)
            return
        finally:
            reporting.set()
        if exact and outcome.status in (SolveStatus.OPTIMAL, SolveStatus.INFEASIBLE):
            stop.set()
        found.append(outcome)

    start = time.perf_counter()
    thread = threading.Thread(target=intervals, daemon=True)
    thread.start()
    try:
        _head_start(reporting, stop)
        left = None if time_limit is None else max(0.01, time_limit - (time.perf_counter() - start))
        outcome = solve_highs(milp, left, warm[0], reports[0], gaps, stop, grace=STREAMED_GRACE, nice=HIGHS_NICE)
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


def _head_start(reporting: threading.Event, stop: threading.Event) -> None:
    """Wait until the CP-SAT worker reports (it has started and loaded its model), ends, or HEAD_START seconds pass,
    or `stop` is set (Ctrl-C, a proof): its start-up, a Python importing OR-Tools, is slowed most by HiGHS's threads."""
    deadline = time.perf_counter() + HEAD_START
    while not (reporting.is_set() or stop.is_set()) and time.perf_counter() < deadline:
        reporting.wait(0.05)
