"""Baseline schedules every solver result is compared against, and the liveness schedule builder.

Both baselines follow the frontier-advancing stage order (stage t computes operator t for the first
time, after the recomputations it needs) and free every output after its last use, which is what
onnxruntime does with the rewritten graph.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute, Copy, Event, Free, Schedule
from onnx_remat.passes.simulate import Simulation, simulate
from onnx_remat.passes.solve.liveness import holders_at_end, schedule_from_steps
from onnx_remat.passes.solve.staged import StagedRun, staged_run

ALL_LENGTHS_UP_TO = 48
LONG_LENGTH_STEP = 1.08


def schedule_from_stages(problem: Problem, stages: Sequence[Sequence[int]], prune: bool = False) -> Schedule:
    """Events for the computes `stages[t]` (in order) on device 0, each output freed right after its last use.

    A recomputation whose output is never read is dropped (it only costs time and memory); with
    `prune`, so is a first computation whose output only a later recomputation serves (the
    frontier-advancing diagonal forces those). The last instance of each graph output is kept to the end.
    """
    steps = [Compute(op, stage) for stage, ops in enumerate(stages) for op in ops]
    return schedule_from_steps(problem, steps, dict.fromkeys(problem.graph_outputs, 0), prune)


def prune_unread(problem: Problem, schedule: Schedule) -> Schedule:
    """The schedule without any computation nobody reads while the operator has another instance.

    onnxruntime holds an output nobody reads until the run ends, so such a computation costs memory
    as well as time. The result lies outside the MILP's frontier-advancing form: use it for output only,
    never as a warm start."""
    steps = [event for event in schedule.events if not isinstance(event, Free)]
    return schedule_from_steps(problem, steps, holders_at_end(problem, schedule), prune=True)


def keep_all(problem: Problem) -> Schedule:
    """Topological order, every operator once, each output freed after its last use: no recomputation."""
    return schedule_from_stages(problem, keep_all_stages(problem))


def keep_all_stages(problem: Problem) -> list[list[int]]:
    """The stages of `keep_all`: operator t alone in stage t."""
    return [[t] for t in range(problem.num_ops)]


def chen_sqrt_n(problem: Problem) -> Schedule:
    """Chen et al. 2016: ~sqrt(n) segments; only segment ends (and graph outputs) outlive their segment."""
    return schedule_from_stages(problem, chen_sqrt_n_stages(problem))


def chen_sqrt_n_stages(problem: Problem) -> list[list[int]]:
    """The stages of `chen_sqrt_n`."""
    return chen_stages(problem, max(1, math.ceil(math.sqrt(problem.num_ops))))


def chen_segments(problem: Problem, length: int) -> Schedule:
    """Segments of `length` operators; only segment ends (and graph outputs and operators computed once) outlive
    their segment.

    An output of an earlier segment that is not a checkpoint is recomputed, from the checkpoints it
    depends on, when an operator needs it; it is then kept while the frontier stays in that segment.
    """
    return schedule_from_stages(problem, chen_stages(problem, length))


def chen_stages(problem: Problem, length: int) -> list[list[int]]:
    """The stages of `chen_segments`. What is held grows with each stage of a segment (its operators and what they
    recomputed) and starts again from the checkpoints at the next: built afresh at every stage, the stages of moe's
    training step's 82 lengths took 0.73 s, now 0.27 (the same stages; measured)."""
    checkpoints = {i for i in range(problem.num_ops) if (i + 1) % length == 0}
    checkpoints |= {*problem.graph_outputs, *problem.computed_once}
    stages: list[list[int]] = []
    held: set[int] = set()
    for t in range(problem.num_ops):
        if t % length == 0:
            held = set(checkpoints)
        stages.append(_needed(problem, t, held))
        held.update(stages[-1])
    return stages


def segment_lengths(num_ops: int) -> list[int]:
    """Every length up to ALL_LENGTHS_UP_TO, then lengths ~8% apart up to n-1: at tight budgets another length than
    sqrt(n) often fits, and neighbouring long lengths fit alike, so a 1000-operator graph tries ~90, not 1000."""
    lengths = list(range(1, min(ALL_LENGTHS_UP_TO, num_ops - 1) + 1)) or [1]
    while lengths[-1] < num_ops - 1:
        lengths.append(min(num_ops - 1, max(lengths[-1] + 1, round(lengths[-1] * LONG_LENGTH_STEP))))
    return lengths


def segmentations(problem: Problem) -> Iterator[Schedule]:
    """Chen's segments at the lengths of `segment_lengths`, their events built: what `segmented_baselines` figures
    without building them (the tests compare the two)."""
    for length in segment_lengths(problem.num_ops):
        yield chen_segments(problem, length)


def frontier_only(problem: Problem) -> Schedule:
    """Hold across stages only the previous operator's output, graph outputs and operators computed once; recompute
    the rest.

    The least-memory baseline (and the costliest): it seeds the minimum-budget search and gives the
    MILP a warm start at budgets where Chen's checkpoints no longer fit.
    """
    return schedule_from_stages(problem, frontier_only_stages(problem))


def frontier_only_stages(problem: Problem) -> list[list[int]]:
    """The stages of `frontier_only`."""
    held = {*problem.graph_outputs, *problem.computed_once}
    return [_needed(problem, t, held, t - 1) for t in range(problem.num_ops)]


def _needed(problem: Problem, op: int, held: Container[int], previous: int = -1) -> list[int]:
    """`op` and every ancestor it must recompute because it is neither in `held` nor `previous` (the operator the
    frontier holds besides, if any), ascending. `previous` seeds the visited set, so the walk tests membership only:
    a predicate per input made frontier-only's stages on DenseNet-121's training step 0.16 CPU s, now 0.10."""
    needed, stack = {op, previous}, [op]
    while stack:
        for pred in problem.predecessors[stack.pop()]:
            if pred not in needed and pred not in held:
                needed.add(pred)
                stack.append(pred)
    needed.discard(previous)
    return sorted(needed)


BASELINES: dict[str, Callable[[Problem], list[list[int]]]] = {
    "keep-all": keep_all_stages,
    "chen-sqrt-n": chen_sqrt_n_stages,
    "frontier-only": frontier_only_stages,
}
"""Each baseline's stages (`schedule_from_stages` makes them a schedule)."""


def on_device(problem: Problem, device: int) -> Problem:
    """`problem` restricted to one of its devices (the others unused): every operator runs there, so it holds every
    loaded group."""
    return replace(
        problem,
        devices=(problem.devices[device],),
        cost=(problem.cost[device],),
        resident_bytes=(problem.resident_with(device, range(problem.num_ops)),),
        loaded=(),
        budgets=(problem.budgets[device],),
        kept_bytes=(problem.kept_bytes[device],),
        copy_seconds_per_byte=((0.0,),),
        copy_fixed_seconds=((0.0,),),
    )


def placed(schedule: Schedule, device: int) -> Schedule:
    """A single-device schedule run on `device` instead."""
    events: list[Event] = []
    for event in schedule.events:
        if isinstance(event, Copy):
            raise ValueError(f"placed() takes a single-device schedule, and this one copies: {event}")
        events.append(replace(event, device=device))
    return Schedule(tuple(events))


@dataclass(frozen=True)
class Baseline:
    """A baseline run entirely on one device: its name ("baseline@device" when there are several devices), its peak
    on each device and its cost, as the simulator measures them; its events are built when first asked for, since
    only a chosen baseline's are used (frontier-only on DenseNet-121's training step: 1.15 million events, 3 s)."""

    name: str
    device: int
    peak_bytes: tuple[int, ...]
    total_cost: float
    run: StagedRun = field(repr=False, compare=False)

    def fits(self, budgets: Sequence[int]) -> bool:
        """Whether every device's peak is within its budget."""
        return all(peak <= budget for peak, budget in zip(self.peak_bytes, budgets, strict=True))

    @functools.cached_property
    def schedule(self) -> Schedule:
        """The events, built once."""
        return self.run.schedule(self.device)


BASELINES_KEPT = 4
"""Problems whose baselines are kept: the minimum-budget search, the solver and the report each ask for one
problem's."""


def baselines_of(problem: Problem) -> tuple[Baseline, ...]:
    """Every baseline run entirely on each device in turn; figured once per problem whatever its budgets, which
    neither reads."""
    return _baselines_of(replace(problem, budgets=(0,) * problem.num_devices))


@functools.lru_cache(maxsize=BASELINES_KEPT)
def _baselines_of(problem: Problem) -> tuple[Baseline, ...]:
    """`baselines_of` a problem with its budgets zeroed, kept for the next caller."""
    found: list[Baseline] = []
    for device in range(problem.num_devices):
        alone = on_device(problem, device)
        found.extend(_baseline(problem, device, name, stages(alone)) for name, stages in BASELINES.items())
    return tuple(found)


def segmented_baselines(problem: Problem, more: Callable[[], bool] = lambda: True) -> Iterator[Baseline]:
    """Chen's segments at each length of `segment_lengths` on each device in turn, as baselines named "segments-L",
    each built only while `more()` says so. Their peaks and costs come from their staged runs, and the events of none
    are built until asked for: building and simulating every length's took 7.6 of the 8.3 s that a search of them all
    took on moe's training step (618 operators, 82 lengths; measured)."""
    for device in range(problem.num_devices):
        alone = on_device(problem, device)
        for length in segment_lengths(problem.num_ops):
            if not more():
                return
            yield _baseline(problem, device, f"segments-{length}", chen_stages(alone, length))


def _baseline(problem: Problem, device: int, name: str, stages: Sequence[Sequence[int]]) -> Baseline:
    """The baseline of `stages` (figured on `device` alone) on `device`, the other devices holding their resident
    bytes."""
    run = staged_run(problem, stages)
    peaks = tuple(run.peak_bytes(problem, device) if d == device else resident
                  for d, resident in enumerate(problem.resident_bytes))
    label = name if problem.num_devices == 1 else f"{name}@{problem.devices[device]}"
    return Baseline(label, device, peaks, run.compute_cost(problem, device), run)


def fitting(problem: Problem, schedules: Iterable[Schedule | None]) -> Iterator[tuple[Schedule, Simulation]]:
    """Each of `schedules` (None skipped) whose simulated peaks are within every budget, with its simulation."""
    for schedule in schedules:
        if schedule is not None and (simulation := simulate(problem, schedule)).fits(problem.budgets):
            yield schedule, simulation


def cheapest_fitting(problem: Problem, schedules: Iterable[Schedule | None]) -> Schedule | None:
    """The cheapest of `schedules` within every budget (the first of equals), or None if none fits."""
    best = min(fitting(problem, schedules), key=lambda found: found[1].total_cost, default=None)
    return None if best is None else best[0]


def best_segmented(problem: Problem, deadline: float | None = None) -> Schedule | None:
    """The cheapest Chen segmentation of any length, on one device, that fits every device's budget, or None. Once one
    fits, no more lengths are tried past `deadline` (a perf_counter reading; None: all are)."""
    fits: list[Baseline] = []

    def more() -> bool:
        return not fits or deadline is None or time.perf_counter() < deadline

    for baseline in segmented_baselines(problem, more):
        if baseline.fits(problem.budgets):
            fits.append(baseline)
    best = min(fits, key=lambda baseline: baseline.total_cost, default=None)
    return None if best is None else best.schedule


def best_baseline(problem: Problem) -> Schedule | None:
    """The cheapest baseline on one device that fits every device's budget (the first of equals), or None."""
    fits = [baseline for baseline in baselines_of(problem) if baseline.fits(problem.budgets)]
    best = min(fits, key=lambda baseline: baseline.total_cost, default=None)
    return None if best is None else best.schedule
