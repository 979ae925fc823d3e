"""A lower bound from memory cuts: what the outputs that do not fit where they are cheapest must cost.

In the frontier-advancing form stage t first computes operator t, at its last position. While it runs, on
some device D, D holds t's inputs, output and workspace besides whatever outputs i < t stay held past stage t
(read by j > t, or graph outputs); each of those is then held on some device, or computed again in a later
stage (after the last stage: never). Device d holds at most budget - resident bytes. Beyond computing every
operator once on its cheapest device (the trivial bound), an output costs
- held nowhere at some cut: a recomputation, at least its cheapest cost (an operator computed once cannot be
  recomputed, so it is held somewhere at every cut it is read after);
- held on device d at some cut, or computed there: its arrival, a computation there above the cheapest or a
  copy into d, whichever is less (nothing where it is cheapest);
- first computed on device d: that computation above the cheapest (its arrival there, at least);
- computed on device d (first, or again for any reason): that computation above the cheapest;
- with two devices of which one, home, is cheapest for every operator, held on the other device only at a cut
  that a later operator reads it after: its way back, a copy home, a recomputation or a reader computed on the
  other device (charged to that reader as its computation there). A recomputation may be both the way back and
  the one a cut where it is held nowhere asks for, and a computation on d is also an arrival there, so the model
  charges the largest of (arrivals or computations) + (way back or recomputation), not their sum.
Each output pays each of these at most once however many cuts need it, the arrivals on distinct devices and a
recomputation are distinct events (a recomputation on d that is also the arrival on d costs both), and distinct
outputs' events are distinct: so the cheapest placement of every output at every cut at once, each output's costs
charged once, bounds the extra cost. That is a small MILP (0/1 placements; in a schedule each is a fact), far
smaller than the schedule's; the bound is the trivial one plus HiGHS's proven bound on it within a time limit
(at least its LP relaxation's optimum once the root is solved).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

import numpy as np

from onnx_remat.core.problem import Problem
from onnx_remat.passes.solve.backend import SolveStatus, SparseMilp
from onnx_remat.passes.solve.checkmate_milp import MilpBuilder
from onnx_remat.passes.solve.highs_worker import model_arrays, run
from onnx_remat.passes.solve.min_budget import step_bytes

MAX_HELD = 10_000
"""Held outputs summed over the cuts in the model, beyond which only the cuts that hold the most bytes go in (any
subset of cuts still gives a bound, and on the models measured the fullest 10k give the same bound as all of them
many times faster: docs/measurements.md)."""

BOUND_SECONDS = 10.0
"""Default time for proving the bound, a few times what HiGHS takes on VGG16 (docs/measurements.md)."""

BOUND_TOLERANCE = 1e-6
"""Relative slack taken off the proven bound, well above HiGHS's feasibility tolerances, so the bound stays one."""


@dataclass(frozen=True)
class Cut:
    """Operator `op` first running: the outputs held past its stage besides its inputs, and what it holds itself."""

    op: int
    held: list[int]
    step_bytes: int
    need: int
    """Bytes of the held outputs and the step together."""
    last: bool
    """The last stage: nothing can be computed after it, so every held output must be held somewhere."""


class CutMilp(MilpBuilder):
    """The cut model as it grows: 0/1 columns, rows given as (column, coefficient) terms."""

    def binary(self, count: int, upper: float = 1.0) -> np.ndarray:
        """`count` new integral columns in [0, upper]; their indices."""
        return self.columns(count, 0.0, upper, integer=True)

    def terms(self, terms: list[tuple[int, float]], lower: float, upper: float = math.inf) -> None:
        """lower <= sum of coefficient * column over `terms` <= upper."""
        kept = [(int(col), float(value)) for col, value in terms if value != 0.0]
        self.row([col for col, _ in kept], [value for _, value in kept], lower, upper)


def _proven_bound(milp: SparseMilp, time_limit: float, stop: threading.Event) -> float | None:
    """HiGHS's proven bound on the optimum of `milp` after at most `time_limit` seconds or until `stop`; None if it
    proves none (no placement fits, or the root LP unsolved)."""
    options: dict[str, float] = {"threads": 2, "random_seed": 0}
    status, _, bound = run(model_arrays(milp), options, None, stop, deadline=time.time() + time_limit)
    return None if status == SolveStatus.INFEASIBLE else bound


@dataclass(frozen=True)
class OutputColumns:
    """Per output i, the model's columns of what it costs and which of the module docstring's events it has."""

    charged: np.ndarray
    """[i]: its extra cost."""
    held_on: np.ndarray
    """[d, i]: present on d at some time (held at a cut, computed or copied there)."""
    computed_on: np.ndarray
    """[d, i]: computed on d at some time."""
    away: np.ndarray
    """[i]: with a home device, held on the other device and not home at a cut that a later operator reads it
    after."""
    dropped: np.ndarray
    """[i]: held nowhere at some cut that a later operator reads it after."""


def cut_lower_bound(problem: Problem, time_limit: float = BOUND_SECONDS, stop: threading.Event | None = None) -> float:
    """A lower bound in seconds on every schedule of `problem` within its budgets, proven within `time_limit`
    seconds or until `stop` is set (already set: the trivial bound)."""
    costs = np.array(problem.cost, dtype=float)
    cheapest = costs.min(axis=0)
    if stop is not None and stop.is_set():
        return float(cheapest.sum())
    return float(cheapest.sum() + _joint_cuts(problem, costs, cheapest, time_limit, stop or threading.Event()))


def _joint_cuts(
    problem: Problem, costs: np.ndarray, cheapest: np.ndarray, time_limit: float, stop: threading.Event
) -> float:
    """The least extra cost over all memory-short cuts at once (see the module docstring), in seconds."""
    devices, n = costs.shape
    arrival = _arrival_costs(problem, costs, cheapest)
    home = _home(costs, cheapest)
    capacity = np.array(problem.budgets, dtype=float) - np.array(problem.resident_bytes, dtype=float)
    free = (arrival == 0) & (costs == cheapest)
    if home is not None:
        free[1 - home] = False
    cuts = _cuts(problem, free, capacity)
    if not cuts:
        return 0.0
    scale = float(np.abs(costs).max()) or 1.0
    unit = max(float(max(problem.output_bytes)), float(max(c.step_bytes for c in cuts)), 1.0)
    lp = CutMilp()
    charged = lp.columns(n, 0.0, math.inf, integer=False)
    for column in charged:
        lp.cost[column] = 1.0
    held_on, computed_on = (lp.binary(devices * n).reshape(devices, n) for _ in range(2))
    each = OutputColumns(charged, held_on, computed_on, lp.binary(n), lp.binary(n))
    runs_on = {cut.op: _add_cut(lp, cut, problem, each, home, capacity / unit, unit) for cut in cuts}
    extra = (costs - cheapest) / scale
    for i in range(n):
        first = [(runs_on[i][d], -(extra - arrival / scale)[d, i]) for d in range(devices)] if i in runs_on else []
        arrive = [(each.held_on[d, i], -arrival[d, i] / scale) for d in range(devices)]
        recompute = (each.dropped[i], -cheapest[i] / scale)
        lp.terms([(charged[i], 1.0), *arrive, *first, recompute], 0.0)
        computations = [(each.computed_on[d, i], -extra[d, i]) for d in range(devices)]
        lp.terms([(charged[i], 1.0), *computations, recompute], 0.0)
        for d in range(devices):
            lp.terms([(each.held_on[d, i], 1.0), (each.computed_on[d, i], -1.0)], 0.0)
        if home is not None and problem.successors[i]:
            way_back = _add_way_back(lp, problem, each, home, i, scale)
            lp.terms([(charged[i], 1.0), *arrive, *first, way_back], 0.0)
            lp.terms([(charged[i], 1.0), *computations, way_back], 0.0)
    bound = _proven_bound(lp.build(unit), time_limit, stop)
    return 0.0 if bound is None else max(0.0, bound) * scale * (1 - BOUND_TOLERANCE)


def _cuts(problem: Problem, free: np.ndarray, capacity: np.ndarray) -> list[Cut]:
    """The cuts at which memory is short: those whose outputs and step fit on no device where they cost nothing."""
    sizes = problem.output_bytes
    outputs = set(problem.graph_outputs)
    last_read = [max(problem.successors[i], default=-1) for i in range(problem.num_ops)]
    cuts = []
    for t in range(problem.num_ops):
        inputs = set(problem.predecessors[t])
        held = [i for i in range(t) if (last_read[i] > t or i in outputs) and i not in inputs]
        step = step_bytes(problem, t)
        need = sum(sizes[i] for i in held) + step
        involved = [*held, *inputs, t]
        if not any(need <= capacity[d] and free[d, involved].all() for d in range(problem.num_devices)):
            cuts.append(Cut(t, held, step, need, t == problem.num_ops - 1))
    return _fullest(cuts)


def _fullest(cuts: list[Cut]) -> list[Cut]:
    """The cuts holding the most bytes, in operator order, with at most MAX_HELD held outputs in all."""
    chosen, held = [], 0
    for cut in sorted(cuts, key=lambda cut: cut.need, reverse=True):
        if held + len(cut.held) <= MAX_HELD:
            chosen.append(cut)
            held += len(cut.held)
    return sorted(chosen, key=lambda cut: cut.op)


def _add_cut(
    lp: CutMilp, cut: Cut, problem: Problem, each: OutputColumns, home: int | None, room: np.ndarray, unit: float
) -> np.ndarray:
    """One cut's columns x[d, k] (held output k on d), y[k] (held nowhere), z[d] (the operator runs on d), its
    rows, and their links to the outputs' columns; returns z.

    With a home device, an input or the output of the operator read after the cut and not held at home as well
    (column h, its memory there) is away on the other device as far as the operator runs there."""
    devices = problem.num_devices
    x = lp.binary(devices * len(cut.held)).reshape(devices, len(cut.held))
    y = lp.binary(len(cut.held), 0.0 if cut.last else 1.0)
    z = lp.binary(devices)
    once = set(problem.computed_once)
    for k, i in enumerate(cut.held):
        if i in once:
            lp.upper[int(y[k])] = 0.0  # computed once: held through every cut it is read after, never recomputed
        lp.terms([*((x[d, k], 1.0) for d in range(devices)), (y[k], 1.0)], 1.0, 1.0)
        lp.terms([(each.dropped[i], 1.0), (y[k], -1.0)], 0.0)
        for d in range(devices):
            lp.terms([(each.held_on[d, i], 1.0), (x[d, k], -1.0)], 0.0)
        if home is not None and max(problem.successors[i], default=-1) > cut.op:
            lp.terms([(each.away[i], 1.0), (x[1 - home, k], -1.0)], 0.0)
    lp.terms([(z[d], 1.0) for d in range(devices)], 1.0, 1.0)
    for d in range(devices):
        lp.terms([(each.computed_on[d, cut.op], 1.0), (z[d], -1.0)], 0.0)
        for i in problem.predecessors[cut.op]:
            lp.terms([(each.held_on[d, i], 1.0), (z[d], -1.0)], 0.0)
    also_home: list[tuple[int, float]] = []
    if home is not None:
        for i in {cut.op, *problem.predecessors[cut.op]}:
            if max(problem.successors[i], default=-1) > cut.op:
                h = lp.binary(1)[0]
                lp.terms([(each.away[i], 1.0), (h, 1.0), (z[1 - home], -1.0)], 0.0)
                also_home.append((h, problem.output_bytes[i] / unit))
    for d in range(devices):
        memory = [(x[d, k], problem.output_bytes[i] / unit) for k, i in enumerate(cut.held)]
        extra = also_home if d == home else []
        lp.terms([*memory, *extra, (z[d], cut.step_bytes / unit)], -math.inf, max(room[d], 0.0))
    return z


def _add_way_back(
    lp: CutMilp, problem: Problem, each: OutputColumns, home: int, i: int, scale: float
) -> tuple[int, float]:
    """Output i's way back from the other device: a copy home or a recomputation (column v, charged to i), or a
    reader computed on the other device (charged to the reader); returns v's term for i's charge row."""
    other = 1 - home
    direct = lp.binary(1)[0]
    readers = problem.successors[i]
    via = lp.binary(len(readers))
    lp.terms([(direct, 1.0), *((column, 1.0) for column in via), (each.away[i], -1.0)], 0.0)
    for column, reader in zip(via, readers, strict=True):
        lp.terms([(each.computed_on[other, reader], 1.0), (column, -1.0)], 0.0)
    cost = min(problem.copy_seconds(i, other, home), problem.cost[home][i])
    return direct, -cost / scale


def _home(costs: np.ndarray, cheapest: np.ndarray) -> int | None:
    """With two devices, the one that is cheapest for every operator, if any."""
    homes = [h for h in range(len(costs)) if np.all(costs[h] <= cheapest)]
    return homes[0] if len(costs) == 2 and homes else None


def _arrival_costs(problem: Problem, costs: np.ndarray, cheapest: np.ndarray) -> np.ndarray:
    """[d, i]: the least extra cost of output i being on device d: computed there, or copied in."""
    devices, n = costs.shape
    copy = np.array(problem.copy_seconds_per_byte, dtype=float)
    fixed = np.array(problem.copy_fixed_seconds, dtype=float)
    sizes = np.array(problem.output_bytes, dtype=float)
    arrival = np.zeros((devices, n))
    for d in range(devices):
        copy_in = np.full(n, np.inf)  # one device: no copies
        for s in range(devices):
            if s != d:
                copy_in = np.minimum(copy_in, fixed[s, d] + sizes * copy[s, d])
        arrival[d] = np.minimum(costs[d] - cheapest, copy_in)
    return arrival
