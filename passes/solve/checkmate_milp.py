"""Checkmate's frontier-advancing MILP on any number of devices (XEngine's model, linearized), built once
as a sparse model for any backend. With one device it is Checkmate's model.

Variables per device d (stage t, operator i <= t): R[d,t,i] compute; S[d,t,i] held on d from stage t-1
into t (i < t; S[d,T,i] for graph outputs: held after the last stage T-1); C[d,e,t,i] copy i from d to e
in stage t; FREE[d,t,i,k] release i on d right after position k of stage t (k reads i, or k == i);
U[d,t,k] the memory of d after position k, resident bytes included; KEPT[d] what d's runtime keeps for all the
computations R puts on it (Problem.kept_bytes), which every U[d,t,0] holds (only where d keeps any); LOADED[d,g]
whether d holds the loaded group g (Problem.loaded: parameters, inputs), >= every R[d,t,v] of a reader v, which every
U[d,t,0] holds too (with one device there are no groups: all is resident). Stage t runs
positions 0..t: at position k, operator k is computed where R says, then copied where C says, then outputs are freed.
Stage t computes operator t for the first time on at least one device. An operator computed once
(Problem.computed_once) is computed in its own stage only, on one device.

XEngine's quadratic copy term becomes C: a consumer on e needs each input computed or held on e, or
copied to e in that stage from a device that computes or holds it. Unlike the paper (eq. 11, 13), a
copy occupies its target's memory from its position on and may be kept there
(S[e,t+1,i] <= S[e,t,i] + R[e,t,i] + sum_d C[d,e,t,i]), which gives offloading.

FREE only has to stay below the product R[d,t,k] * (1 - S[d,t+1,i]) * prod(1 - R[d,t,j]) over the later
readers j of i on d (for k == i, R[d,t,i] + S[d,t,i] instead of R[d,t,k]): a free the solver leaves out
only overestimates memory, and the schedule extracted from R, S and C frees every output at its last use
anyway. So FREE is continuous and bounded by each factor, which is exact for 0/1 values and tighter in
the LP relaxation than Checkmate's hazard rows; an output's frees in one stage also sum to at most
1 - S[d,t+1,i] and to at most what brought it there less what keeps it (_free_rows). Each stage also gets a knapsack
row over S, implied by the memory rows, from which HiGHS derives cover cuts (_stage_knapsack_row). With `stages`
(build_model) U, FREE and their rows exist for those stages only, and the knapsack rows alone bound the others'
memory: a relaxation (lazy.py).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnx_remat.core.errors import SolverError
from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute, Copy, Matrices, Schedule
from onnx_remat.passes.solve.backend import SparseMilp
from onnx_remat.passes.solve.liveness import Step, schedule_from_steps
from onnx_remat.passes.solve.sparse import Compressed

MAX_MILP_CELLS = 100_000
"""Devices x operators^2 above which the MILP is not built and the heuristics answer (status "heuristic"):
beyond it HiGHS does not finish the root LP, or finds nothing better than the warm start and no bound above the
memory-cut bound, within the time limits used (docs/measurements.md). Its child process (highs.py) would keep
such a run within the time limit, but it would add nothing."""


def too_large(problem: Problem) -> bool:
    """Whether the problem's MILP is over MAX_MILP_CELLS, so neither the solver nor the minimum search builds it."""
    return problem.num_devices * problem.num_ops**2 > MAX_MILP_CELLS


BUILD_SECONDS_PER_CELL = 4e-5
"""CPU seconds building the MILP takes per device x operator^2 on an idle core: DenseNet-121's inference (309
operators) 3.7 s, 39 us a cell; the unet_small fixture's training step (179) 0.76 s, 24 us (measured)."""


def build_seconds(problem: Problem, slowdown: float = 1.0) -> float:
    """About how long building the problem's MILP takes on a machine `slowdown` times slower than an idle one: where
    less time than that is left, building it would only overrun the time limit."""
    return slowdown * BUILD_SECONDS_PER_CELL * problem.num_devices * problem.num_ops**2


MEMORY_STEPS = 1e4
"""The memory unit is keep-all / MEMORY_STEPS bytes, so solver tolerances stay far below a byte."""


@dataclass(frozen=True)
class FreeVar:
    """FREE[d, t, i, k]: release i on device d after position k of stage t."""

    d: int
    t: int
    i: int
    k: int


@dataclass(frozen=True)
class PeakRange:
    """Minimize the peak of `device`, known to lie in [lower, upper] bytes, instead of the cost."""

    device: int
    lower: int
    upper: int


@dataclass(frozen=True)
class CheckmateModel:
    """The sparse MILP plus where each variable lives (-1: no variable) and its units.

    `objective_unit` is seconds (cost model) or bytes (peak model) per unit of the MILP objective.
    """

    problem: Problem
    milp: SparseMilp
    r: np.ndarray
    s: np.ndarray
    c: np.ndarray
    u: np.ndarray
    frees: tuple[FreeVar, ...]
    free_cols: np.ndarray
    kept: np.ndarray
    loaded: np.ndarray
    peak: PeakRange | None
    peak_col: int | None
    objective_unit: float
    memory_unit: float

    def matrices(self, x: np.ndarray) -> Matrices:
        """The 0/1 matrices of a solution vector."""
        return Matrices(*(_values(index, x) > 0.5 for index in (self.r, self.s, self.c)))

    def schedule(self, x: np.ndarray) -> Schedule:
        """The schedule of a 0/1 solution: recomputes and copies of held outputs dropped, frees at last use."""
        m = self.matrices(x)
        return schedule_from_steps(self.problem, list(_steps(m)), _final(self.problem, m))

    def assignment(self, schedule: Schedule) -> np.ndarray:
        """The full solution vector of a frontier-advancing schedule (a warm start)."""
        m = schedule.matrices(self.problem.num_ops, self.problem.num_devices)
        x = np.zeros(len(self.milp.cost))
        for index, values in ((self.r, m.computed), (self.s, m.held), (self.c, m.copied)):
            x[index[index >= 0]] = values[index >= 0]
        x[self.free_cols] = [self._free_value(m, f) for f in self.frees]
        self._fill_memory(x, m)
        return x

    def _free_value(self, m: Matrices, f: FreeVar) -> float:
        """The product of the factors bounding FREE[d,t,i,k] (see the module docstring)."""
        present = m.computed[f.d, f.t, f.k] or (f.k == f.i and m.held[f.d, f.t, f.i])
        kept = self.s[f.d, f.t + 1, f.i] >= 0 and m.held[f.d, f.t + 1, f.i]
        later = (j for j in self.problem.successors[f.i] if f.k < j <= f.t)
        return float(present and not kept and not any(m.computed[f.d, f.t, j] for j in later))

    def _fill_memory(self, x: np.ndarray, m: Matrices) -> None:
        """U by its recurrence from R, S, C and FREE; the peak variable (if any) as the peak device's need."""
        p, unit = self.problem, self.memory_unit
        freed: dict[tuple[int, int, int], float] = {}
        for f, col in zip(self.frees, self.free_cols, strict=True):
            freed[f.d, f.t, f.k] = freed.get((f.d, f.t, f.k), 0.0) + x[col] * p.output_bytes[f.i] / unit
        arrived = m.computed + m.copied.any(axis=0)
        sizes = np.array(p.output_bytes, dtype=float)
        for d in range(p.num_devices):
            kept = float(np.asarray(p.kept_bytes[d], dtype=float) @ m.computed[d].sum(axis=0))
            if self.kept[d] >= 0:
                x[self.kept[d]] = kept / unit
            computed = np.flatnonzero(m.computed[d].any(axis=0))
            for g, group in enumerate(p.loaded):
                x[self.loaded[d, g]] = float(not set(computed).isdisjoint(group.readers))
            resident = p.resident_with(d, computed.tolist())
            need = 0.0
            for t in range(p.num_ops):
                memory = (resident + kept + sizes[:t] @ m.held[d, t, :t]) / unit
                for k in range(t + 1):
                    memory += arrived[d, t, k] * p.output_bytes[k] / unit - freed.get((d, t, k - 1), 0.0)
                    if self.u[d, t, k] >= 0:
                        x[self.u[d, t, k]] = memory
                    need = max(need, memory + m.computed[d, t, k] * p.workspace_bytes[k] / unit)
            if self.peak is not None and self.peak.device == d:
                x[self.peak_col] = need


def _steps(m: Matrices) -> Iterator[Step]:
    """Computes and needed copies in stage order; at position k: k's computes, then its copies."""
    devices, n = m.computed.shape[:2]
    for t in range(n):
        for k in range(t + 1):
            here = [d for d in range(devices) if m.computed[d, t, k] and not m.held[d, t, k]]
            yield from (Compute(k, t, d) for d in here)
            for e in range(devices):
                sources = np.flatnonzero(m.copied[:, e, t, k])
                if len(sources) and not (m.computed[e, t, k] or m.held[e, t, k]):
                    yield Copy(k, t, int(sources[0]), e)


def _final(problem: Problem, m: Matrices) -> dict[int, int]:
    """For each graph output, the first device holding it at the end."""
    return {i: int(np.flatnonzero(m.held[:, problem.num_ops, i])[0]) for i in problem.graph_outputs}


def _values(index: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x at each entry of an index array, 0 where there is no variable."""
    values = np.zeros(index.shape)
    values[index >= 0] = x[index[index >= 0]]
    return values


class MilpBuilder:
    """Accumulates columns and rows as flat lists, then packs them into a SparseMilp."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.integer: list[bool] = []
        self.entry_rows: list[int] = []
        self.entry_cols: list[int] = []
        self.entry_vals: list[float] = []
        self.row_lower: list[float] = []
        self.row_upper: list[float] = []

    def columns(self, count: int, lower: float, upper: float, integer: bool) -> np.ndarray:
        start = len(self.cost)
        self.cost += [0.0] * count
        self.lower += [lower] * count
        self.upper += [upper] * count
        self.integer += [integer] * count
        return np.arange(start, start + count)

    def row(self, cols: list[int], vals: list[float], lower: float, upper: float) -> None:
        self.entry_rows += [len(self.row_lower)] * len(cols)
        self.entry_cols += cols
        self.entry_vals += vals
        self.row_lower.append(lower)
        self.row_upper.append(upper)

    def at_most(self, col: int, others: list[int], limit: float = 0.0) -> None:
        """x[col] - sum(x[others]) <= limit, skipping missing (-1) variables."""
        others = [int(o) for o in others if o >= 0]
        self.row([int(col), *others], [1.0] + [-1.0] * len(others), -math.inf, limit)

    def at_least_one(self, cols: np.ndarray) -> None:
        """sum(x[cols]) >= 1, as a lower bound when there is one column."""
        if len(cols) == 1:
            self.lower[int(cols[0])] = 1.0
        else:
            self.row([int(col) for col in cols], [1.0] * len(cols), 1.0, math.inf)

    def build(self, byte_unit: float) -> SparseMilp:
        shape = (len(self.row_lower), len(self.cost))
        matrix = Compressed.from_entries(self.entry_rows, self.entry_cols, self.entry_vals, shape)
        return SparseMilp(
            cost=np.array(self.cost),
            col_lower=np.array(self.lower),
            col_upper=np.array(self.upper),
            integer=np.array(self.integer, dtype=bool),
            matrix=matrix,
            row_lower=np.array(self.row_lower),
            row_upper=np.array(self.row_upper),
            byte_unit=byte_unit,
        )


def build_model(
    problem: Problem, peak: PeakRange | None = None, stages: Collection[int] | None = None
) -> CheckmateModel:
    """The MILP minimizing compute and copy cost within every budget, or `peak.device`'s peak within its range.

    `stages`: the stages whose memory is followed position by position (U, FREE and their limits); None: every stage.
    Every stage keeps its knapsack row (_stage_knapsack_row), so with fewer stages the model is a relaxation whose
    schedules may exceed a budget inside a stage left out (lazy.py adds such stages until one fits)."""
    n, devices = problem.num_ops, problem.num_devices
    followed = range(n) if stages is None else sorted(set(stages))
    cost_unit = max((c for row in problem.cost for c in row), default=0.0) or 1.0
    largest = max(problem.keep_all_bytes(d) for d in range(devices)) + max(problem.workspace_bytes, default=0)
    memory_unit = max(1.0, largest / MEMORY_STEPS)
    b = MilpBuilder()
    r = np.stack([_triangle(n, 0, b, integer=True) for _ in range(devices)])
    s = np.stack([_held_columns(problem, b) for _ in range(devices)])
    c = _copy_columns(problem, b)
    u = np.stack([_memory_columns(n, followed, b) for _ in range(devices)])
    frees = tuple(
        FreeVar(d, t, i, k)
        for d in range(devices)
        for t in followed
        for k in range(t + 1)
        for i in (*problem.predecessors[k], k)
    )
    free_cols = b.columns(len(frees), 0.0, 1.0, integer=False)
    kept = _kept_columns(problem, b, r, memory_unit)
    loaded = _loaded_columns(problem, b, r)
    if peak is None:
        _objective(problem, b, r, c, cost_unit)
    _stage_rows(problem, b, r, s, c)
    _once_rows(problem, b, r)
    _copy_rows(problem, b, r, s, c)
    _free_rows(problem, b, (r, s, c), frees, free_cols)
    _memory_rows(problem, b, (r, s, c, u, kept, loaded), frees, free_cols, memory_unit, followed)
    peak_col = _limit_rows(problem, b, (r, s, u, kept, loaded), memory_unit, peak, followed)
    unit = memory_unit if peak else cost_unit
    milp = b.build(memory_unit)
    return CheckmateModel(problem, milp, r, s, c, u, frees, free_cols, kept, loaded, peak, peak_col, unit,
                          memory_unit)


def _memory_columns(n: int, stages: Sequence[int], b: MilpBuilder) -> np.ndarray:
    """U of one device: an n x n index matrix of continuous columns at positions k <= t of each stage t of `stages`,
    else -1."""
    index = np.full((n, n), -1, dtype=np.int64)
    for t in stages:
        index[t, : t + 1] = b.columns(t + 1, 0.0, math.inf, integer=False)
    return index


def _triangle(n: int, diagonal: int, b: MilpBuilder, integer: bool, upper: float = 1.0) -> np.ndarray:
    """An n x n index matrix of new columns on and below `diagonal` (0: i <= t, -1: i < t), else -1."""
    index = np.full((n, n), -1, dtype=np.int64)
    rows, cols = np.tril_indices(n, diagonal)
    index[rows, cols] = b.columns(len(rows), 0.0, upper, integer)
    return index


def _held_columns(problem: Problem, b: MilpBuilder) -> np.ndarray:
    """S of one device: (T+1) x T, i < t, and in row T the graph outputs (held at the end)."""
    n = problem.num_ops
    index = np.vstack([_triangle(n, -1, b, integer=True), np.full((1, n), -1, dtype=np.int64)])
    outputs = sorted(set(problem.graph_outputs))
    index[n, outputs] = b.columns(len(outputs), 0.0, 1.0, integer=True)
    return index


def _copy_columns(problem: Problem, b: MilpBuilder) -> np.ndarray:
    """C[d,e,t,i] for d != e and i <= t, if something reads i or i is a graph output."""
    n, devices = problem.num_ops, problem.num_devices
    index = np.full((devices, devices, n, n), -1, dtype=np.int64)
    useful = [i for i in range(n) if problem.successors[i] or i in problem.graph_outputs]
    for d in range(devices):
        for e in range(devices):
            if d != e:
                cells = [(t, i) for i in useful for t in range(i, n)]
                index[d, e, [t for t, _ in cells], [i for _, i in cells]] = b.columns(len(cells), 0.0, 1.0, True)
    return index


def _objective(problem: Problem, b: MilpBuilder, r: np.ndarray, c: np.ndarray, cost_unit: float) -> None:
    """Seconds of every compute and every copy, in units of `cost_unit`."""
    for d, costs in enumerate(problem.cost):
        for (_, i), col in np.ndenumerate(r[d]):
            if col >= 0:
                b.cost[col] = costs[i] / cost_unit
    for (d, e, _, i), col in np.ndenumerate(c):
        if col >= 0:
            b.cost[col] = problem.copy_seconds(i, d, e) / cost_unit


def _stage_rows(problem: Problem, b: MilpBuilder, r: np.ndarray, s: np.ndarray, c: np.ndarray) -> None:
    """Keep only what was held, computed or copied in; compute only from that; the frontier; outputs at the end."""
    n, devices = problem.num_ops, problem.num_devices
    for e in range(devices):
        for t in range(n):
            for i in range(t + 1):
                if s[e, t + 1, i] >= 0:
                    b.at_most(s[e, t + 1, i], [s[e, t, i], r[e, t, i], *c[:, e, t, i]])
        for u, v in set(problem.edges):
            for t in range(v, n):
                b.at_most(r[e, t, v], [r[e, t, u], s[e, t, u], *c[:, e, t, u]])
        for t in range(n):
            for i in range(t):
                _used_row(problem, b, (r, s, c), e, t, i)
    for t in range(n):
        b.at_least_one(r[:, t, t])
    for i in set(problem.graph_outputs):
        b.at_least_one(s[:, n, i])


def _once_rows(problem: Problem, b: MilpBuilder, r: np.ndarray) -> None:
    """An operator computed once runs only in its own stage (R[d,t,i] = 0 for t > i), on one device."""
    for i in problem.computed_once:
        for col in r[:, i + 1 :, i].ravel():
            b.upper[int(col)] = 0.0
        if problem.num_devices > 1:
            b.row([int(col) for col in r[:, i, i]], [1.0] * problem.num_devices, -math.inf, 1.0)


def _used_row(problem: Problem, b: MilpBuilder, rsc: tuple[np.ndarray, ...], e: int, t: int, i: int) -> None:
    """R[e,t,i] <= readers of i computed later on e in stage t + S[e,t+1,i] + copies of i out of e.

    Dropping a recompute nobody uses never costs more or needs more memory, so the optimum is
    unchanged; the row only removes useless branches and tightens the relaxation.
    """
    r, s, c = rsc
    readers = [r[e, t, j] for j in problem.successors[i] if j <= t]
    b.at_most(r[e, t, i], [*readers, s[e, t + 1, i], *c[e, :, t, i]])


def _copy_rows(problem: Problem, b: MilpBuilder, r: np.ndarray, s: np.ndarray, c: np.ndarray) -> None:
    """C[d,e,t,i] <= R[d,t,i] + S[d,t,i] (the source has it) and <= its readers on e in stage t + S[e,t+1,i]."""
    for (d, e, t, i), col in np.ndenumerate(c):
        if col >= 0:
            b.at_most(col, [int(r[d, t, i]), int(s[d, t, i])])
            readers = [r[e, t, j] for j in problem.successors[i] if j <= t]
            b.at_most(col, [*readers, s[e, t + 1, i]])


def _free_rows(
    problem: Problem, b: MilpBuilder, rsc: tuple[np.ndarray, ...], frees: tuple[FreeVar, ...], cols: np.ndarray
) -> None:
    """FREE[d,t,i,k] <= R[d,t,k] (k == i: + S[d,t,i]), <= 1 - R[d,t,j] for readers j after k; and i's frees in a
    stage together (at most one is 1: the last reader's) <= 1 - S[d,t+1,i] and <= R + S + copies in - S[d,t+1,i].

    The last row is what the per-FREE bounds miss in the LP relaxation: with S[d,t,i] = S[d,t+1,i] = 0.4, each FREE
    could be 0.4, so the relaxation held 0.4 of a tensor and freed it again in every stage, and proved no more than
    computing every operator once (concat22: its root bound 5.30 against the optimum 6.31)."""
    r, s, c = rsc
    grouped: dict[tuple[int, int, int], list[int]] = {}
    for f, col in zip(frees, cols, strict=True):
        col = int(col)
        grouped.setdefault((f.d, f.t, f.i), []).append(col)
        b.at_most(col, [r[f.d, f.t, f.k]] + ([s[f.d, f.t, f.i]] if f.k == f.i else []))
        for j in problem.successors[f.i]:
            if f.k < j <= f.t:
                b.row([col, int(r[f.d, f.t, j])], [1.0, 1.0], -math.inf, 1.0)
    for (d, t, i), group in grouped.items():
        kept = [int(s[d, t + 1, i])] if s[d, t + 1, i] >= 0 else []
        freed = [*group, *kept]
        b.row(freed, [1.0] * len(freed), -math.inf, 1.0)
        present = [int(col) for col in (r[d, t, i], s[d, t, i], *c[:, d, t, i]) if col >= 0]
        b.row([*freed, *present], [1.0] * len(freed) + [-1.0] * len(present), -math.inf, 0.0)


def _kept_columns(problem: Problem, b: MilpBuilder, r: np.ndarray, memory_unit: float) -> np.ndarray:
    """KEPT[d] = the kept bytes of every computation on d (in memory units), for each device that keeps any; -1
    for the others."""
    kept = np.full(problem.num_devices, -1, dtype=np.int64)
    for d, per_op in enumerate(problem.kept_bytes):
        if any(per_op):
            kept[d] = b.columns(1, 0.0, math.inf, integer=False)[0]
            cells = [(int(col), per_op[i] / memory_unit) for (_, i), col in np.ndenumerate(r[d])
                     if col >= 0 and per_op[i]]
            b.row([int(kept[d]), *(col for col, _ in cells)], [1.0, *(-value for _, value in cells)], 0.0, 0.0)
    return kept


def _loaded_columns(problem: Problem, b: MilpBuilder, r: np.ndarray) -> np.ndarray:
    """LOADED[d,g] >= R[d,t,v] for every reader v of group g and stage t >= v: continuous, since the memory rows only
    push it down to the largest of those 0/1 values."""
    loaded = np.full((problem.num_devices, len(problem.loaded)), -1, dtype=np.int64)
    for d in range(problem.num_devices):
        for g, group in enumerate(problem.loaded):
            loaded[d, g] = b.columns(1, 0.0, 1.0, integer=False)[0]
            for v in group.readers:
                for col in r[d, v:, v]:
                    b.row([int(col), int(loaded[d, g])], [1.0, -1.0], -math.inf, 0.0)
    return loaded


def _loaded_terms(problem: Problem, loaded: np.ndarray, d: int, memory_unit: float) -> tuple[list[int], list[float]]:
    """The LOADED columns of device d and their bytes in memory units."""
    return ([int(col) for col in loaded[d]],
            [group.bytes[d] / memory_unit for group in problem.loaded])


def _memory_rows(
    problem: Problem,
    b: MilpBuilder,
    rscu: tuple[np.ndarray, ...],
    frees: tuple[FreeVar, ...],
    free_cols: np.ndarray,
    memory_unit: float,
    stages: Sequence[int],
) -> None:
    """U[d,t,0] = resident + KEPT + LOADED + held + arrivals of 0; U[d,t,k] = U[d,t,k-1] - freed after k-1 + arrivals
    of k, for each stage t of `stages`.

    An arrival of k on d is its computation there or a copy of it to d.
    """
    r, s, c, u, kept, loaded = rscu
    sizes = [size / memory_unit for size in problem.output_bytes]
    freed: dict[tuple[int, int, int], tuple[list[int], list[float]]] = {}
    for f, col in zip(frees, free_cols, strict=True):
        cols, vals = freed.setdefault((f.d, f.t, f.k), ([], []))
        cols.append(int(col))
        vals.append(sizes[f.i])
    for d in range(problem.num_devices):
        resident = problem.resident_bytes[d] / memory_unit
        group_cols, group_vals = _loaded_terms(problem, loaded, d, memory_unit)
        for t in stages:
            arrivals = _arrivals(r, c, d, t, 0)
            held = [int(kept[d])] if kept[d] >= 0 else []
            cols = [int(u[d, t, 0]), *held, *group_cols, *(int(s[d, t, i]) for i in range(t)), *arrivals]
            vals = [1.0, *[-1.0] * len(held), *(-v for v in group_vals), *(-sizes[i] for i in range(t)),
                    *[-sizes[0]] * len(arrivals)]
            b.row(cols, vals, resident, resident)
            for k in range(1, t + 1):
                fcols, fvals = freed.get((d, t, k - 1), ([], []))
                arrivals = _arrivals(r, c, d, t, k)
                cols = [int(u[d, t, k]), int(u[d, t, k - 1]), *fcols, *arrivals]
                b.row(cols, [1.0, -1.0, *fvals] + [-sizes[k]] * len(arrivals), 0.0, 0.0)


def _arrivals(r: np.ndarray, c: np.ndarray, d: int, t: int, k: int) -> list[int]:
    """The columns that put k's output on d at position k of stage t: its compute and copies to d."""
    return [int(r[d, t, k])] + [int(col) for col in c[:, d, t, k] if col >= 0]


def _limit_rows(
    problem: Problem,
    b: MilpBuilder,
    rsuk: tuple[np.ndarray, ...],
    memory_unit: float,
    peak: PeakRange | None,
    stages: Sequence[int],
) -> int | None:
    """U[d,t,k] + workspace_k R[d,t,k] <= d's budget in each stage t of `stages`, or on the peak device <= a peak
    variable B (returned); and every stage's knapsack row (_stage_knapsack_row) within the same limit.

    The budget gets half a byte of slack: peaks are whole bytes, so this is exact and keeps solver
    tolerances from cutting off a schedule that fits to the byte.
    """
    r, s, u, kept, loaded = rsuk
    peak_col = None
    if peak is not None:
        bounds = peak.lower / memory_unit, (peak.upper + 0.5) / memory_unit
        peak_col = int(b.columns(1, *bounds, integer=False)[0])
        b.cost[peak_col] = 1.0
    for d in range(problem.num_devices):
        if peak is not None and peak_col is not None and peak.device == d:
            limit = Limit(0.0, [peak_col], [-1.0])
        else:
            limit = Limit((problem.budgets[d] + 0.5) / memory_unit, [], [])
        for t in stages:
            for k in range(t + 1):
                cols = [int(u[d, t, k]), int(r[d, t, k]), *limit.cols]
                b.row(cols, [1.0, problem.workspace_bytes[k] / memory_unit, *limit.coefficients], -math.inf, limit.rhs)
        for t in range(problem.num_ops):
            _stage_knapsack_row(problem, b, (r, s, kept, loaded), (d, t), memory_unit, limit)
    return peak_col


@dataclass(frozen=True)
class Limit:
    """The right-hand side of a device's memory rows in memory units, and the peak variable's term (if any)."""

    rhs: float
    cols: list[int]
    coefficients: list[float]


def _stage_knapsack_row(
    problem: Problem,
    b: MilpBuilder,
    rsk: tuple[np.ndarray, ...],
    where: tuple[int, int],
    memory_unit: float,
    limit: Limit,
) -> None:
    """Stage t on device d: resident + KEPT + LOADED + the outputs held into stage t+1 (but t and its inputs) + (t's
    output, inputs and workspace) R[d,t,t] within d's limit.

    Every output held into stage t+1 is present at position t (an output kept past a stage is freed nowhere in it),
    and so are t's inputs when t runs there. The memory rows imply it, but only through t rows of continuous U and
    FREE; stated over the 0/1 S directly it is a knapsack HiGHS derives cover cuts from (the peers' unet4_p40: root
    bound after HiGHS's cuts 84.06 -> 84.83 ms, chain40_p40 345.33 -> 346.07 ms, above the memory-cut bound)."""
    r, s, kept, loaded = rsk
    d, t = where
    inputs = set(problem.predecessors[t])
    step = problem.output_bytes[t] + problem.workspace_bytes[t] + sum(problem.output_bytes[i] for i in inputs)
    held = [i for i in range(t) if i not in inputs and s[d, t + 1, i] >= 0 and problem.output_bytes[i]]
    keeps = [int(kept[d])] if kept[d] >= 0 else []
    group_cols, group_vals = _loaded_terms(problem, loaded, d, memory_unit)
    cols = [int(s[d, t + 1, i]) for i in held] + [int(r[d, t, t]), *keeps, *group_cols]
    vals = [*(problem.output_bytes[i] / memory_unit for i in held), step / memory_unit, *[1.0] * len(keeps),
            *group_vals]
    rhs = limit.rhs - problem.resident_bytes[d] / memory_unit
    b.row([*cols, *limit.cols], [*vals, *limit.coefficients], -math.inf, rhs)


def write_mps(problem: Problem, path: str | Path) -> None:
    """Write the cost-minimizing MILP of `problem` as an MPS file with readable column names (HiGHS writes it:
    imported here, so the model itself loads no solver)."""
    import highspy

    from onnx_remat.passes.solve.highs_worker import highs_lp, model_arrays, quiet_highs

    model = build_model(problem)
    lp = highs_lp(model_arrays(model.milp))
    lp.col_names_ = column_names(model)
    lp.row_names_ = [f"r{row}" for row in range(lp.num_row_)]
    h = quiet_highs()
    h.passModel(lp)
    if h.writeModel(str(path)) != highspy.HighsStatus.kOk:
        raise SolverError(f"HiGHS could not write {path}")


def column_names(model: CheckmateModel) -> list[str]:
    """R_d_t_i, S_d_t_i, C_d_e_t_i, U_d_t_k, FREE_d_t_i_k, KEPT_d, LOADED_d_g and PEAK, by column."""
    names = [""] * len(model.milp.cost)
    for prefix, index in (("R", model.r), ("S", model.s), ("C", model.c), ("U", model.u)):
        for position, col in np.ndenumerate(index):
            if col >= 0:
                names[col] = "_".join((prefix, *map(str, position)))
    for f, col in zip(model.frees, model.free_cols, strict=True):
        names[col] = f"FREE_{f.d}_{f.t}_{f.i}_{f.k}"
    for d, col in enumerate(model.kept):
        if col >= 0:
            names[col] = f"KEPT_{d}"
    for (d, g), col in np.ndenumerate(model.loaded):
        names[col] = f"LOADED_{d}_{g}"
    if model.peak_col is not None:
        names[model.peak_col] = "PEAK"
    return names
