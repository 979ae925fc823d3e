"""The smallest budget any schedule fits in: a quick lower bound and the peak-minimizing MILP.

The CLI states this number when it refuses a budget, so a user knows what to ask for instead. With
several devices, the minimum budget of one device is taken with every other device held to its
given budget (and free to take work over, copies included).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from onnx_remat.core.errors import InfeasibleBudgetError
from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Schedule
from onnx_remat.passes.simulate import simulate
from onnx_remat.passes.solve.backend import MilpOutcome, SolveStatus
from onnx_remat.passes.solve.baselines import (
    baselines_of,
    fitting,
    segmented_baselines,
)
from onnx_remat.passes.solve.checkmate_milp import CheckmateModel, PeakRange, build_model, build_seconds, too_large
from onnx_remat.passes.solve.defer import deferred
from onnx_remat.passes.solve.highs import STREAMED_GRACE, solve_highs
from onnx_remat.passes.solve.offload import Work, offload


@dataclass(frozen=True)
class MinBudget:
    """`lower` <= the minimum budget <= `feasible` bytes (a schedule peaks at `feasible`); equal when proven.
    `schedule` is the one found peaking at `feasible`, where kept: a solver at that budget starts from it."""

    lower: int
    feasible: int
    schedule: Schedule | None = field(default=None, compare=False, repr=False)


def step_bytes(problem: Problem, v: int) -> int:
    """What running operator v holds on its device besides resident memory: inputs, output, workspace."""
    return sum(problem.output_bytes[op] for op in {v, *problem.predecessors[v]}) + problem.workspace_bytes[v]


def quick_lower_bound(problem: Problem, device: int = 0) -> int:
    """A bound no schedule beats on `device`.

    One device: the largest single step, its last input's production, or all outputs. When operator
    v runs, its inputs and output are held; earlier, when the last of its inputs p was computed, the
    other inputs of v, p's own inputs, p and p's workspace were all held at once. Several devices: the
    largest step among the operators that fit on no other device within its budget (with the loaded groups they read
    there), beside the loaded groups they all read.
    """
    resident = problem.resident_bytes[device]
    if problem.num_devices > 1:
        others = [d for d in range(problem.num_devices) if d != device]
        forced = [
            v for v in range(problem.num_ops)
            if all(problem.resident_with(d, (v,)) + step_bytes(problem, v) > problem.budgets[d] for d in others)
        ]
        loaded = problem.loaded_bytes(device, forced)
        return resident + loaded + max((step_bytes(problem, v) for v in forced), default=0)
    sizes, preds = problem.output_bytes, problem.predecessors

    def last_input(v: int) -> int:
        held = (sum(sizes[op] for op in {p, *preds[v], *preds[p]}) + problem.workspace_bytes[p] for p in preds[v])
        return min(held, default=0)

    steps = max((max(step_bytes(problem, v), last_input(v)) for v in range(problem.num_ops)), default=0)
    kept = problem.kept_of(device, range(problem.num_ops))  # every operator runs at least once
    return resident + kept + max(steps, sum(sizes[op] for op in set(problem.graph_outputs)))


def minimum_budget(problem: Problem, device: int = 0, time_limit: float = 10.0, slowdown: float = 1.0) -> MinBudget:
    """The minimum budget on `device`, proven by HiGHS minimizing the peak unless `time_limit` runs out.

    The heuristics' candidates come first, whatever the limit: the baselines and the eviction heuristic's search,
    bounded by work (eviction_runs per budget, search_runs in all for the limit on a machine `slowdown` times slower
    than an idle one), so the result does not depend on the machine's speed; then Chen's segment lengths
    while time remains, and the MILP gets what is left, if it is not too large to build (checkmate_milp.MAX_MILP_CELLS)
    and what is left covers building it (checkmate_milp.build_seconds: DenseNet-121's inference, 309 operators, took
    22 s past a 20 s search at load 11)."""
    deadline = time.perf_counter() + time_limit
    if problem.num_ops == 0:
        return MinBudget(problem.resident_bytes[device], problem.resident_bytes[device])
    lower = quick_lower_bound(problem, device)
    runs = search_runs(problem, time_limit, slowdown)
    candidates = _candidates(problem, device, deadline, runs)
    if not candidates:
        others = ", ".join(f"{problem.devices[d]} {problem.budgets[d]} bytes" for d in range(problem.num_devices)
                           if d != device)
        raise InfeasibleBudgetError(
            f"no schedule found fits the budgets of the other devices ({others}) whatever the budget of "
            f"{problem.devices[device]}: raise them")
    peak, schedule = min(candidates, key=lambda pair: pair[0])  # in the MILP's form: its range and warm start
    least = min((_deferred(problem, device, found) for _, found in candidates), key=lambda pair: pair[0])
    if least[0] == lower or too_large(problem) or deadline - time.perf_counter() < build_seconds(problem, slowdown):
        return MinBudget(lower, *least)
    model = build_model(problem, PeakRange(device, lower, peak))
    left = deadline - time.perf_counter()
    if left <= 0:
        return MinBudget(lower, *least)
    outcome = _bounded_highs(model, left, model.assignment(schedule))
    bound = None if outcome.bound is None else math.ceil(outcome.bound * model.memory_unit - 0.5)
    if outcome.x is not None:
        found = model.schedule(outcome.x)
        if outcome.status == SolveStatus.OPTIMAL:
            bound = _peak(problem, found, device)
        least = min(least, _deferred(problem, device, found), key=lambda pair: pair[0])
    if bound is not None and bound <= least[0]:  # the MILP's bound holds for its form, which deferral leaves
        lower = max(lower, bound)
    return MinBudget(min(lower, least[0]), *least)


def _deferred(problem: Problem, device: int, schedule: Schedule) -> tuple[int, Schedule]:
    """`schedule` with graph outputs nobody reads computed again at its end where that lowers its peak (defer.py), and
    that peak on `device`."""
    schedule = deferred(problem, schedule)
    return _peak(problem, schedule, device), schedule


def _bounded_highs(model: CheckmateModel, seconds: float, warm_start: np.ndarray) -> MilpOutcome:
    """HiGHS minimizing the peak for `seconds` at most: its own limit goes unchecked in a long root LP, so a timer
    stops it too (its child process is killed then, keeping the best solution and bound it streamed), holding the
    search to its time."""
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.daemon = True
    timer.start()
    try:
        return solve_highs(model.milp, seconds, warm_start, gaps=(0.0, 0.5 / model.memory_unit), stop=stop,
                           grace=STREAMED_GRACE)
    finally:
        timer.cancel()


def _candidates(problem: Problem, device: int, deadline: float, runs: int | None) -> list[tuple[int, Schedule]]:
    """(peak on `device`, schedule) of the baseline peaking least there, of the eviction heuristic at the least
    budget of `device` it fits (searched in `runs` operator runs), and (until `deadline`) of Chen's segments of each
    length on one device that peak below every candidate before them, among those that fit every other device's
    budget."""

    def fits_others(peaks: tuple[int, ...]) -> bool:
        return all(peaks[d] <= problem.budgets[d] for d in range(problem.num_devices) if d != device)

    least = min((b for b in baselines_of(problem) if fits_others(b.peak_bytes)), key=lambda b: b.peak_bytes[device],
                default=None)  # the only baseline that can be the least: its events alone are built
    found = [] if least is None else [(least.peak_bytes[device], least.schedule)]

    evicting = _least_evicting(problem, device, min((peak for peak, _ in found), default=None), runs)
    if evicting is not None and fits_others(peaks := simulate(problem, evicting).peak_bytes):
        found.append((peaks[device], evicting))

    def more() -> bool:
        """Chen's segments are built while time remains, or nothing was found yet: the first, built before the
        deadline was looked at, took 0.05 CPU s on DenseNet-121's training step."""
        return not found or time.perf_counter() < deadline

    for segmented in segmented_baselines(problem, more):
        peak = segmented.peak_bytes[device]
        if fits_others(segmented.peak_bytes) and all(peak < known for known, _ in found):  # it can be the least:
            found.append((peak, segmented.schedule))  # its events alone are built
    return found


EVICTION_RUNS = 10
"""Operator runs per operator the eviction heuristic may try at one budget of the search before that budget counts
as not fitting (offload's work limit, so a loaded machine searches the same budgets): where it fits it tries about
one per operator, where not it can cascade for minutes (DenseNet-121's training step: 1.0 and 2.4-3.6 per operator,
measured)."""


RUN_SECONDS_PER_OPERATOR = 5e-8
"""CPU seconds an operator run of the eviction heuristic takes per operator of the problem (it scores what it holds):
8.1e-5 s a run on DenseNet-121's training step (1531 operators), 7.7e-6 on the README's U-Net (176; measured)."""
SEARCH_FLOOR_SECONDS = 0.2
"""CPU seconds of the eviction search that any time limit, even 0, pays for: small problems' whole search (the README's
U-Net's takes 4k operator runs of the 22k it pays for)."""
SEARCH_FLOOR_RUNS = 4
"""Operator runs per operator that any time limit, even 0, pays for: the first budget tried, a baseline's peak, where
the heuristic fits with about one (DenseNet-121's training step 1.0), and one halving below it (swin_v2_t's training
step: 2.5 at 363 MiB, two passes of the heuristic for the bytes its recomputations keep; with 2 the search stated the
baseline's 379.5 MiB, no recomputation; measured)."""


def eviction_runs(problem: Problem) -> int:
    """The eviction heuristic's work limit on `problem`: EVICTION_RUNS operator runs per operator."""
    return EVICTION_RUNS * problem.num_ops


def search_runs(problem: Problem, seconds: float, slowdown: float = 1.0) -> int:
    """Operator runs the minimum search's eviction heuristic may try in all in `seconds` on a machine `slowdown` times
    slower than an idle one: those an idle core runs in `seconds / slowdown` (at least SEARCH_FLOOR_SECONDS), and at
    least SEARCH_FLOOR_RUNS per operator, for the first budget tried and one below it. A work bound that shrinks with
    the limit, never a race with the clock (the solver's own warm start at the budget has its own, eviction_runs)."""
    idle_seconds = max(seconds / slowdown, SEARCH_FLOOR_SECONDS)
    per_run = max(1, problem.num_ops) * RUN_SECONDS_PER_OPERATOR
    return max(SEARCH_FLOOR_RUNS * problem.num_ops, int(idle_seconds / per_run))


def _least_evicting(
    problem: Problem, device: int, high: int | None = None, runs: int | None = None
) -> Schedule | None:
    """The eviction heuristic's schedule at the least budget of `device` (searched by halving, to 0.5%) at which it
    fits, the other devices at their budgets; None if it fits not even at keep-all. The search starts at `high` (a
    budget a baseline fits), or at keep-all where the heuristic does not fit there. Bounded by work, not time: at
    most eviction_runs per budget tried, and `runs` operator runs from each start (None: no limit; once they are spent
    the budgets left count as not fitting, and the least that fitted is the answer)."""
    lower = quick_lower_bound(problem, device)
    for start in dict.fromkeys(b for b in (high, _keep_all_room(problem)) if b is not None):
        work = None if runs is None else Work(runs)

        def fitting(budget: int, work: Work | None = work) -> Schedule | None:
            budgets = tuple(budget if d == device else b for d, b in enumerate(problem.budgets))
            return _evicting(replace(problem, budgets=budgets), eviction_runs(problem), work)

        if (schedule := _least_budget(fitting, lower, start)[1]) is not None:
            return schedule
    return None


def _peak(problem: Problem, schedule: Schedule, device: int) -> int:
    """The simulated peak of `schedule` on `device` (its budget does not matter here)."""
    return simulate(problem, schedule).peak_bytes[device]


def equal_budget_lower_bound(problem: Problem) -> int:
    """A bound no schedule beats when every device gets the same budget.

    Each operator runs on some device, holding that device's resident bytes, the loaded groups it reads and the
    operator's step; at the end the graph outputs are held somewhere, so the devices' room beyond their resident
    bytes holds them all.
    With one device it is `quick_lower_bound`."""
    if problem.num_devices == 1:
        return quick_lower_bound(problem)
    residents = problem.resident_bytes
    steps = max(
        (min(problem.resident_with(d, (v,)) + step_bytes(problem, v) for d in range(problem.num_devices))
         for v in range(problem.num_ops)), default=0
    )
    outputs = sum(problem.output_bytes[op] for op in set(problem.graph_outputs))
    return max(steps, max(residents), math.ceil((sum(residents) + outputs) / problem.num_devices))


def minimum_equal_budget(problem: Problem) -> MinBudget:
    """`lower` <= the smallest budget that every device can be given at once <= `feasible`.

    `feasible` is the least budget (searched by halving, to 0.5%) at which the offloading heuristic (computing
    on each device, parking on each other one or nowhere) or a baseline on one device fits; it equals `lower`
    when that is proven minimal. Seconds at any size: no MILP runs, so in between nothing is proven."""
    lower = equal_budget_lower_bound(problem)
    return MinBudget(
        lower,
        _least_budget(lambda budget: _fitting_equal(problem, budget), lower, max(_keep_all_room(problem), lower))[0],
    )


def fits_equal_budget(problem: Problem, budget: int) -> bool:
    """Whether a heuristic schedule (the offloading heuristic or a baseline) fits `budget` on every device."""
    return _fitting_equal(problem, budget) is not None


def _fitting_equal(problem: Problem, budget: int) -> Schedule | None:
    """A heuristic schedule (the offloading heuristic or a baseline) within `budget` on every device, or None."""
    equal = replace(problem, budgets=(budget,) * problem.num_devices)
    baselines = (baseline.schedule for baseline in baselines_of(equal) if baseline.fits(equal.budgets))
    return _evicting(equal, eviction_runs(problem)) or next(baselines, None)


def _keep_all_room(problem: Problem) -> int:
    """A budget at which keeping everything on any one device fits: its keep-all plus the largest workspace."""
    keep = max(problem.keep_all_bytes(d) for d in range(problem.num_devices))
    return keep + max(problem.workspace_bytes, default=0)


DESCENT = 0.8
"""Each step down of the least-budget search, before it halves between the last budget that fits and the first
that does not."""


SWEEP_STEP = 0.01
"""Budgets the downward sweep below the halving's least budget tries lie this share of it apart."""
SWEEP_MISSES = 2
"""Budgets in a row that do not fit, after which the downward sweep stops. Each costs most at a tight budget: on
DenseNet-121's training step 1.3-2.2 CPU s each (8 of them took the search at a 10 s limit from 6.1 to 15.9 CPU s;
measured under load 15), where the operator runs they take are 3-4 per operator, within the work bound."""


def _least_budget(fitting: Callable[[int], Schedule | None], lower: int, high: int) -> tuple[int, Schedule | None]:
    """The least budget found in [lower, high] at which `fitting` gives a schedule, and it; `high` and None if none fits
    at `high` either. It steps down from `high`, the easy end, by DESCENT until a budget fails or the step would pass
    `lower`, then halves between the two (to 0.5% of high), then sweeps down below (`_swept_down`: fitting is not
    monotone in the budget); `lower` is tried last, once (a budget that does not fit costs most: swin_v2_t's training
    step spent 0.85 operator runs per operator failing at its `lower` before halving, and with no time left its
    search's work ran out before the first budget below its baseline)."""
    best = fitting(high)
    if best is None:
        return high, None
    low = lower
    while (step := int(high * DESCENT)) > lower:
        if (schedule := fitting(step)) is None:
            low = step
            break
        high, best = step, schedule
    while high - low > max(1, high // 200):
        middle = (low + high) // 2
        if (schedule := fitting(middle)) is not None:
            high, best = middle, schedule
        else:
            low = middle
    high, best = _swept_down(fitting, lower, high, best)
    if high > lower and (at_lower := fitting(lower)) is not None:
        return lower, at_lower
    return high, best


def _swept_down(fitting: Callable[[int], Schedule | None], lower: int, high: int,
                best: Schedule) -> tuple[int, Schedule]:
    """The least budget that fits, and its schedule, among `high` (which fits with `best`) and the budgets SWEEP_STEP
    of it apart below it, down to `lower` and until SWEEP_MISSES in a row do not fit: the eviction heuristic can fit
    a budget below one it does not, where the halving stops (the bytes the runtime keeps per computation make it: a
    7-operator graph of the tests fits 29 and 31 bytes, not 30)."""
    step = max(1, int(high * SWEEP_STEP))
    budget, misses = high - step, 0
    while budget > lower and misses < SWEEP_MISSES:
        if (schedule := fitting(budget)) is not None:
            high, best, misses = budget, schedule, 0
        else:
            misses += 1
        budget -= step
    return high, best


def _evicting(problem: Problem, max_runs: int | None = None, work: Work | None = None) -> Schedule | None:
    """A schedule of the eviction heuristic (computing on each device, parking on each other one or nowhere)
    within every budget, or None (also when each tries more than `max_runs` operator runs, or `work` runs out)."""
    devices = range(problem.num_devices)
    pairs = ((c, s) for c in devices for s in [*[d for d in devices if d != c], None])
    return _fitting(problem, (offload(problem, c, s, max_runs, work) for c, s in pairs))


def _fitting(problem: Problem, schedules: Iterable[Schedule | None]) -> Schedule | None:
    """The first of `schedules` that is not None and fits every budget, or None."""
    return next((schedule for schedule, _ in fitting(problem, schedules)), None)
