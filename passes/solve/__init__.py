"""The solver: Checkmate's MILP on any number of devices, on a chosen backend, never worse than the baselines.

`solve(problem)` builds the MILP, warm-starts it with the cheapest schedule the heuristics find (baselines
and the eviction heuristic; with several devices also each device solved alone), runs the backend ("auto" on one
device: HiGHS on the MILP's stage relaxation, lazy.py, and CP-SAT on retention intervals at once, portfolio.py) and
checks the schedule it returns with the simulator before handing it out. Above MAX_MILP_CELLS the MILP is not built
and the best heuristic schedule is the answer. Before the backend runs, the memory-cut bound (lower_bound.py) is
proven, which spares the backend where it shows the heuristics' schedule optimal; the stated bound is the
backend's or that one, whichever is higher. Ctrl-C (SIGINT) during a solve stops the backend and returns the best
schedule found so far, with status "interrupted"; a second Ctrl-C aborts. A time limit holds for the whole solve:
the backend gets what is left of it after the warm starts, the bound and model building, less a reserve, and a
timer stops it if it overruns.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NoReturn

from onnx_remat.core.budget import below_minimum
from onnx_remat.core.errors import RematError, SolverError, UsageError
from onnx_remat.core.options import SOLVERS
from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Schedule
from onnx_remat.passes.simulate import Simulation, check_schedule
from onnx_remat.passes.solve.backend import Backend, MilpOutcome, MilpProgress, SolveStatus
from onnx_remat.passes.solve.baselines import (
    best_baseline,
    best_segmented,
    cheapest_fitting,
    keep_all,
    on_device,
    placed,
    prune_unread,
)
from onnx_remat.passes.solve.cbc import solve_cbc
from onnx_remat.passes.solve.checkmate_milp import (
    MAX_MILP_CELLS,
    CheckmateModel,
    build_model,
    build_seconds,
    too_large,
)
from onnx_remat.passes.solve.cpsat import solve_cpsat
from onnx_remat.passes.solve.defer import deferred
from onnx_remat.passes.solve.highs import solve_highs
from onnx_remat.passes.solve.lazy import LazyOutcome
from onnx_remat.passes.solve.lower_bound import BOUND_SECONDS, cut_lower_bound
from onnx_remat.passes.solve.min_budget import eviction_runs, minimum_budget, quick_lower_bound
from onnx_remat.passes.solve.offload import offload
from onnx_remat.passes.solve.portfolio import race
from onnx_remat.passes.solve.proven import StopAtBound, meets

SolveProgress = Callable[[float, float | None, float | None], None]
"""(elapsed seconds, incumbent predicted seconds or None, lower bound or None)."""

BACKENDS: dict[str, Backend] = {"highs": solve_highs, "cbc": solve_cbc, "cpsat": solve_cpsat}
"""Backend name -> the function that runs it (its module in this package). onnx_remat.core.options.SOLVERS, which the
command line offers without loading any solver, lists the same names after "auto" (tests/test_startup.py checks)."""

DEADLINE_RESERVE = 1.0
"""Seconds of a time limit (at least 5% of it) kept from the backend for checking and pruning the answer, and for
the backend overrunning its own limit (HiGHS: up to a second, measured; in its child process, at most child.GRACE
after the deadline timer)."""


PORTFOLIO = "portfolio"
"""The name "auto" resolves to on one device, reported as the solver: HiGHS on the MILP's stage relaxation and CP-SAT
on intervals at once."""

STOPS_AT_BOUND = ("highs", "cpsat", PORTFOLIO)
"""Backends stopped once their incumbent meets the memory-cut bound (proven.py). Not CBC: a stop does not stop it."""

OPTIMALITY_GAP = 2e-6
"""Relative gap at which a schedule counts as optimal: the backends' own (HiGHS's mip_rel_gap), and the memory-cut
bound's, which spares the MILP when it proves the heuristics' schedule or stops it. At 1e-4 a training chain's
schedule 3.5e-5 above the optimum counted as optimal (315.427 against Moccasin's 315.416, measured); 2e-6 is below
a thousandth of a millisecond in 300 ms, and above the cut bound's own slack (lower_bound.BOUND_TOLERANCE)."""

BOUND_SHARE = 0.1
"""Share of a time limit given to proving the memory-cut bound (at most its own default time)."""


def _proven(problem: Problem, incumbent: Schedule | None, bound: float) -> bool:
    """Whether `bound` proves `incumbent` optimal within OPTIMALITY_GAP."""
    return incumbent is not None and meets(_cost(problem, incumbent), bound, OPTIMALITY_GAP)


def _bound_seconds(time_limit: float | None) -> float:
    """Seconds for proving the memory-cut bound within a solve of `time_limit` seconds (None: no limit)."""
    return BOUND_SECONDS if time_limit is None else min(BOUND_SECONDS, BOUND_SHARE * time_limit)


def _reserve(time_limit: float) -> float:
    return max(DEADLINE_RESERVE, 0.05 * time_limit)


def _left(time_limit: float, start: float) -> float:
    """Seconds of `time_limit` (counted from `start`) left for the backend, its reserve kept."""
    return time_limit - _reserve(time_limit) - (time.perf_counter() - start)


def choose_backend(problem: Problem) -> str:
    """The backend "auto" runs: on one device the portfolio of HiGHS (on the MILP's stage relaxation) and CP-SAT on
    intervals (portfolio.py), on several HiGHS, which proves these MILPs faster than CBC and, beyond T of about 20,
    than CP-SAT on the MILP (docs/measurements.md)."""
    return PORTFOLIO if problem.num_devices == 1 else "highs"


@dataclass(frozen=True)
class SolveResult:
    """A checked schedule with its simulation, how the solve ended (OPTIMAL, TIME_LIMIT, HEURISTIC or INTERRUPTED; the
    pipeline's pick by running sets MEASURED) and its bound."""

    schedule: Schedule
    simulation: Simulation
    """The simulator's replay of `schedule` (peaks, memory trace, cost): callers read it instead of replaying again."""
    status: SolveStatus
    objective: float
    bound: float
    gap: float
    seconds: float
    solver: str
    model_objective: float
    """The cost in the MILP's frontier-advancing form, before pruning unread computations, which
    `objective` (the returned schedule's cost) never exceeds; `bound` is a bound on that form."""
    single_device_objective: float | None = None
    """Predicted seconds of the best schedule found that runs on one device only (the warm start), or None."""
    device_schedules: tuple[Schedule | None, ...] = ()
    """With several devices, each device's best schedule alone (unread computations pruned; None: none fits)."""


def solve(
    problem: Problem,
    solver: str = "highs",
    time_limit: float | None = None,
    progress: SolveProgress | None = None,
    hints: Sequence[Schedule] = (),
    slowdown: float = 1.0,
) -> SolveResult:
    """The cheapest schedule within every device's budget that `solver` finds within `time_limit` seconds (on a
    machine `slowdown` times slower than an idle one, which the MILP's build time is judged by).

    `hints` are schedules found before (the minimum-budget search's): those within the budgets join the baselines
    as starting points, so a budget set at a found minimum always has its schedule.

    With several devices each device is first solved alone (the others unused, a quarter of the time
    limit in all); the best of those warm-starts the multi-device MILP, so the result is never
    predicted slower than the best single-device schedule (both in the MILP's frontier-advancing form).
    """
    if solver not in SOLVERS:
        raise UsageError(f"unknown solver {solver!r}: choose one of {', '.join(SOLVERS)}")
    backend = choose_backend(problem) if solver == "auto" else solver
    start = time.perf_counter()
    progress = None if progress is None else BestSoFar(progress)
    _refuse_small_budgets(problem)
    with _stop_on_interrupt() as stop, _deadline(stop, time_limit) as timed_out:
        incumbent, alone = _incumbent(problem, backend, time_limit, start, stop, hints)
        cut_bound = cut_lower_bound(problem, _bound_seconds(time_limit), stop)
        if progress is not None and incumbent is not None:
            progress(time.perf_counter() - start, _cost(problem, incumbent), cut_bound)
        bound: float | None
        if _proven(problem, incumbent, cut_bound):
            schedule, status, bound = incumbent, SolveStatus.OPTIMAL, cut_bound
        else:
            schedule, status, bound = _solve_frontier(
                problem, backend, time_limit, progress, stop, incumbent, start, cut_bound, slowdown
            )
    if status == SolveStatus.INTERRUPTED and timed_out.is_set():
        status = SolveStatus.TIME_LIMIT if schedule is not incumbent else SolveStatus.HEURISTIC
    if schedule is None:
        _no_schedule(problem, status)
    model_objective = _cost(problem, schedule)
    schedule = prune_unread(problem, schedule)
    alone = tuple(None if single is None else prune_unread(problem, single) for single in alone)
    seconds = time.perf_counter() - start
    bound = max(bound if bound is not None else 0.0, cut_bound)
    return _result(problem, schedule, status, bound, model_objective, seconds, backend, alone)


class BestSoFar:
    """A progress callback that only improves: the cheapest incumbent and the highest bound reported so far. The
    portfolio's two searches report in turn, and the memory-cut bound proven before them stays proven."""

    def __init__(self, progress: SolveProgress) -> None:
        self.progress = progress
        self.incumbent: float | None = None
        self.bound: float | None = None

    def __call__(self, seconds: float, incumbent: float | None, bound: float | None) -> None:
        if incumbent is not None:
            self.incumbent = incumbent if self.incumbent is None else min(self.incumbent, incumbent)
        if bound is not None:
            self.bound = bound if self.bound is None else max(self.bound, bound)
        self.progress(seconds, self.incumbent, self.bound)


@contextmanager
def _stop_on_interrupt() -> Iterator[threading.Event]:
    """An event set by the first SIGINT (the backends stop at it); the next SIGINT raises KeyboardInterrupt.

    Outside the main thread signals cannot be caught, so the event then only stops by other means."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    pressed = threading.Event()  # not `stop`: the deadline sets that too, and must not make one Ctrl-C abort

    def handler(signum: int, frame: object) -> None:
        if pressed.is_set():
            raise KeyboardInterrupt
        pressed.set()
        stop.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def _deadline(stop: threading.Event, time_limit: float | None) -> Iterator[threading.Event]:
    """An event set, together with `stop`, once `time_limit` seconds less half the reserve have passed: a
    backstop for backends that overrun their own limits (HiGHS in a large root LP; in its child process it is
    then killed within a second), so the whole solve is held to the limit."""
    timed_out = threading.Event()
    if time_limit is None:
        yield timed_out
        return

    def expire() -> None:
        if not stop.is_set():  # a Ctrl-C came first: the solve stays "interrupted"
            timed_out.set()
            stop.set()

    timer = threading.Timer(max(0.0, time_limit - _reserve(time_limit) / 2), expire)
    timer.daemon = True
    timer.start()
    try:
        yield timed_out
    finally:
        timer.cancel()


def _refuse_small_budgets(problem: Problem) -> None:
    """Raise InfeasibleBudgetError if a device's budget is below its quick lower bound."""
    for device, budget in enumerate(problem.budgets):
        lower = quick_lower_bound(problem, device)
        if budget < lower:
            raise below_minimum(problem, device, budget, lower)


def _solve_frontier(
    problem: Problem,
    solver: str,
    time_limit: float | None,
    progress: SolveProgress | None,
    stop: threading.Event,
    incumbent: Schedule | None,
    start: float,
    proven_bound: float | None = None,
    slowdown: float = 1.0,
) -> tuple[Schedule | None, SolveStatus, float | None]:
    """The best schedule in the MILP's frontier-advancing form (or None), the status and a bound in seconds.

    `time_limit` counts from `start`; if `stop` is already set the MILP is not run and `incumbent` is the answer, nor
    where the time left would not cover building it (on a machine `slowdown` times slower than an idle one).
    The backend stops once it finds a schedule that `proven_bound` (seconds) proves optimal: status "optimal".
    """
    if stop.is_set():
        return incumbent, SolveStatus.INTERRUPTED, None
    if too_large(problem) or (time_limit is not None and _left(time_limit, start) < build_seconds(problem, slowdown)):
        return incumbent, SolveStatus.HEURISTIC, None
    remaining = None if time_limit is None else max(0.01, _left(time_limit, start))
    if solver == PORTFOLIO:
        return _race(problem, remaining, incumbent, progress, stop, start, proven_bound)
    model = build_model(problem)
    warm = None if incumbent is None else model.assignment(incumbent)
    report = _scaled(progress, model, start)
    if proven_bound is not None and solver in STOPS_AT_BOUND:
        report = StopAtBound(proven_bound, model.objective_unit, OPTIMALITY_GAP, stop, report)
    outcome = BACKENDS[solver](model.milp, remaining, warm, report, gaps=(OPTIMALITY_GAP, 1e-6), stop=stop)
    bound = None if outcome.bound is None else outcome.bound * model.objective_unit
    schedule, status = _pick(problem, model, outcome, incumbent)
    if isinstance(report, StopAtBound) and report.reached and status == SolveStatus.INTERRUPTED:
        status = SolveStatus.OPTIMAL if _proven(problem, schedule, report.bound) else SolveStatus.TIME_LIMIT
    return schedule, status, bound


def _race(
    problem: Problem,
    remaining: float | None,
    incumbent: Schedule | None,
    progress: SolveProgress | None,
    stop: threading.Event,
    start: float,
    proven_bound: float | None,
) -> tuple[Schedule | None, SolveStatus, float | None]:
    """The portfolio's cheapest schedule (or `incumbent`), the status and HiGHS's bound in seconds."""
    interval_report: MilpProgress | None = _since(progress, start)
    watches: list[StopAtBound] = []
    if proven_bound is not None:
        watch = StopAtBound(proven_bound, 1.0, OPTIMALITY_GAP, stop, interval_report)
        watches, interval_report = [watch], watch
    found = race(problem, remaining, incumbent, (_since(progress, start), interval_report), (OPTIMALITY_GAP, 1e-6),
                 stop)
    schedule, status, bound = _relaxed_pick(problem, found.milp, incumbent)
    other = found.intervals.schedule
    if other is not None and (schedule is None or _cost(problem, other) < _cost(problem, schedule)):
        schedule = other
        if found.exact and found.intervals.status == SolveStatus.OPTIMAL:
            status = SolveStatus.OPTIMAL
        elif status == SolveStatus.HEURISTIC:  # HiGHS found nothing, CP-SAT did: a search's result, not a heuristic's
            status = SolveStatus.TIME_LIMIT
    if found.exact and found.intervals.status == SolveStatus.INFEASIBLE:  # its proof stopped HiGHS: not a Ctrl-C
        status = SolveStatus.INFEASIBLE
    if any(watch.reached for watch in watches) and status == SolveStatus.INTERRUPTED:
        status = SolveStatus.OPTIMAL if _proven(problem, schedule, proven_bound or 0.0) else SolveStatus.TIME_LIMIT
    return schedule, status, bound


def _incumbent(
    problem: Problem, solver: str, time_limit: float | None, start: float, stop: threading.Event,
    hints: Sequence[Schedule] = (),
) -> tuple[Schedule | None, tuple[Schedule | None, ...]]:
    """The best schedule found without the multi-device MILP, and with several devices each device's best schedule
    alone (None where none fits; with one device, the first).

    One device: the best of the baselines and the recomputing heuristic (Chen's segments of any length if
    none fits, until `time_limit` since `start`, less its reserve, once one fits). Several: each device solved alone,
    and the offloading heuristic on each ordered pair. The eviction heuristics are bounded by work
    (min_budget.eviction_runs), not time, so that a loaded machine or a tiny time limit still starts from their
    schedules."""
    if problem.num_devices == 1:
        deadline = None if time_limit is None else start + time_limit - _reserve(time_limit)
        single = _single_incumbent(problem, hints, deadline=deadline)
        return single, (single,)
    share = None if time_limit is None else time_limit / (4 * problem.num_devices)
    singles: list[Schedule | None] = []
    for device in range(problem.num_devices):
        alone, schedule = on_device(problem, device), None
        if problem.budgets[device] >= quick_lower_bound(alone):
            began = time.perf_counter()
            warm = _single_incumbent(alone, segmented=not too_large(alone))
            schedule = _solve_frontier(alone, solver, share, None, stop, warm, began)[0]
        singles.append(None if schedule is None else placed(schedule, device))
    pairs = [(c, s) for c in range(problem.num_devices) for s in range(problem.num_devices) if c != s]
    offloaded = [offload(problem, c, s, eviction_runs(problem)) for c, s in pairs]
    return cheapest_fitting(problem, [*singles, *hints, *offloaded]), tuple(singles)


def _single_incumbent(
    problem: Problem, hints: Sequence[Schedule] = (), segmented: bool = True, deadline: float | None = None
) -> Schedule | None:
    """The cheapest fitting schedule of the eviction heuristic, the baselines and `hints` on one device, else of
    keep-all with its unread outputs computed last, else (if `segmented`) of Chen's segmentations of every length, or
    past `deadline` the first that fits (unbounded, on moe's training step with roofline costs they took a 2 s limit's
    solve to 47 s beside two busy loops). Each device alone of a graph too large for the MILP skips these: on
    EfficientNet-B0's training step (1055 operators, two CPUs at 40%) their ~90 lengths took 32 s per device and ended
    the run 18 s past its 60 s limit, and the offloading pairs' schedules were the answer."""
    evicting = offload(problem, 0, max_runs=eviction_runs(problem))
    single = cheapest_fitting(problem, (evicting, best_baseline(problem), *hints))
    if single is None:  # keep-all with its unread outputs computed last (defer.py): squeezenet1_1's training step
        single = cheapest_fitting(problem, (deferred(problem, keep_all(problem)),))  # 6.61 MiB where it peaks at 7.96
    if single is None and segmented:
        single = best_segmented(problem, deadline)
    return single


def _scaled(progress: SolveProgress | None, model: CheckmateModel, start: float) -> MilpProgress | None:
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


def _since(progress: SolveProgress | None, start: float) -> MilpProgress | None:
    """A progress callback in seconds reporting wall time since `start` instead of its own."""
    if progress is None:
        return None

    def report(_: float, incumbent: float | None, bound: float | None) -> None:
        progress(time.perf_counter() - start, incumbent, bound)

    return report


def _relaxed_pick(
    problem: Problem, outcome: LazyOutcome, incumbent: Schedule | None
) -> tuple[Schedule | None, SolveStatus, float | None]:
    """The stage relaxation's schedule unless the incumbent is cheaper or it found none, its status and bound."""
    found = outcome.schedule
    if found is not None and (incumbent is None or _cost(problem, found) <= _cost(problem, incumbent)):
        return found, outcome.status, outcome.bound
    unsolved = found is None and outcome.status != SolveStatus.INTERRUPTED and incumbent is not None
    return incumbent, SolveStatus.HEURISTIC if unsolved else outcome.status, outcome.bound


def _pick(
    problem: Problem, model: CheckmateModel, outcome: MilpOutcome, incumbent: Schedule | None
) -> tuple[Schedule | None, SolveStatus]:
    """The solver's schedule unless the incumbent is cheaper or the solver found none."""
    if outcome.x is not None:
        schedule = model.schedule(outcome.x)
        if incumbent is None or _cost(problem, schedule) <= _cost(problem, incumbent):
            return schedule, outcome.status
        return incumbent, outcome.status
    unsolved = outcome.status != SolveStatus.INTERRUPTED and incumbent is not None
    return incumbent, SolveStatus.HEURISTIC if unsolved else outcome.status


def _cost(problem: Problem, schedule: Schedule) -> float:
    """The predicted seconds of a schedule within the budgets."""
    return check_schedule(problem, schedule).total_cost


def _no_schedule(problem: Problem, status: SolveStatus) -> NoReturn:
    """Raise why no schedule was found: the budgets are proven too small, or time ran out."""
    if status == SolveStatus.INTERRUPTED:
        raise KeyboardInterrupt
    if status == SolveStatus.HEURISTIC and too_large(problem):
        raise SolverError(
            f"no heuristic schedule fits the budgets, and at {problem.num_ops} operators on {problem.num_devices} "
            f"device(s) the graph is too large for the exact solver (devices x operators^2 over {MAX_MILP_CELLS:,}): "
            "raise the budgets"
        )
    if status == SolveStatus.HEURISTIC:
        raise SolverError("no heuristic schedule fits the budgets, and the time limit left too little to build the "
                          "exact solver's model: raise --time-limit or the budgets")
    if status != SolveStatus.INFEASIBLE:
        raise SolverError(
            "the solver found no schedule within the time limit and no baseline fits the budget: "
            "raise --time-limit or the budget"
        )
    for device, budget in enumerate(problem.budgets):
        minimum = minimum_budget(problem, device).feasible
        if budget < minimum:
            raise below_minimum(problem, device, budget, minimum)
    raise RematError("the solver proved the budgets admit no schedule, yet each device's is at a minimum a schedule "
                     "was found at: a bug, please report it")


def _result(
    problem: Problem,
    schedule: Schedule,
    status: SolveStatus,
    bound: float,
    model_objective: float,
    seconds: float,
    solver: str,
    alone: tuple[Schedule | None, ...],
) -> SolveResult:
    """Check `schedule` and state its cost with `bound` clamped to the objective."""
    simulation = check_schedule(problem, schedule)
    objective = simulation.total_cost
    bound = min(bound, objective)
    gap = (objective - bound) / objective if objective > 0 else 0.0
    costs = [_cost(problem, single) for single in alone if single is not None]
    single = min(costs, default=None)
    devices = alone if problem.num_devices > 1 else ()
    return SolveResult(
        schedule, simulation, status, objective, bound, gap, seconds, solver, model_objective, single, devices
    )
