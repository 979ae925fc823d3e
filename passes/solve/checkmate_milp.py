"""Checkmate's frontier-advancing MILP for one device, built once as a sparse model for any backend.

Variables (stage t, operator i <= t): R[t,i] compute, S[t,i] held from stage t-1 into t (i < t),
FREE[t,i,k] the output of i is released right after k runs in stage t (k reads i, or k == i), and
U[t,k] the memory after k runs in stage t, resident bytes included. Stage t computes operator t for
the first time. Graph outputs are held after the last stage (a virtual stage T with S[T,i] = 1).

FREE only has to stay below the product R[t,k] * (1 - S[t+1,i]) * prod(1 - R[t,j]) over the later
readers j of i: a free the solver leaves out only overestimates memory, and the schedule extracted
from R and S frees every output at its last use anyway. So FREE is continuous and bounded by each
factor, which is exact for 0/1 R and S and tighter in the LP relaxation than Checkmate's hazard rows.
"""

from __future__ import annotations

import math
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import highspy
import numpy as np
import pulp
from scipy import sparse

from onnx_remat.errors import SolverError
from onnx_remat.passes.solve.baselines import schedule_from_stages
from onnx_remat.problem import Problem
from onnx_remat.schedule import Compute, Free, Schedule

MilpProgress = Callable[[float, float | None, float | None], None]
"""(solver seconds, incumbent objective or None, bound or None), in model units."""

MEMORY_STEPS = 1e4
"""The memory unit is keep-all / MEMORY_STEPS bytes, so solver tolerances stay far below a byte."""


@dataclass(frozen=True)
class SparseMilp:
    """Minimize cost @ x subject to row_lower <= matrix @ x <= row_upper, col bounds, integrality."""

    cost: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    integer: np.ndarray
    matrix: sparse.csr_matrix
    row_lower: np.ndarray
    row_upper: np.ndarray


@dataclass(frozen=True)
class MilpOutcome:
    """What a backend found: a solution vector (or None), "optimal" / "time_limit" / "infeasible", bound."""

    x: np.ndarray | None
    status: str
    bound: float | None


@dataclass(frozen=True)
class FreeVar:
    """FREE[t, i, k]: release i after k runs in stage t."""

    t: int
    i: int
    k: int


@dataclass(frozen=True)
class CheckmateModel:
    """The sparse MILP plus where each variable lives and the units it is expressed in.

    `objective_unit` is seconds (cost model) or bytes (peak model) per unit of the MILP objective.
    """

    problem: Problem
    device: int
    milp: SparseMilp
    r: np.ndarray
    s: np.ndarray
    u: np.ndarray
    frees: tuple[FreeVar, ...]
    free_cols: np.ndarray
    peak_col: int | None
    objective_unit: float
    memory_unit: float

    def schedule(self, x: np.ndarray) -> Schedule:
        """The schedule for a 0/1 solution: recomputes of held outputs dropped, frees at last use."""
        n = self.problem.num_ops
        held = np.zeros((n, n), dtype=bool)
        held[self.s >= 0] = x[self.s[self.s >= 0]] > 0.5
        computed = np.zeros((n, n), dtype=bool)
        computed[self.r >= 0] = x[self.r[self.r >= 0]] > 0.5
        stages = [[i for i in range(t + 1) if computed[t, i] and not held[t, i]] for t in range(n)]
        return schedule_from_stages(self.problem, stages)

    def assignment(self, schedule: Schedule) -> np.ndarray:
        """The full solution vector of a frontier-advancing schedule (a warm start)."""
        computed, held = _matrices(self.problem.num_ops, schedule, self.device)
        x = np.zeros(len(self.milp.cost))
        x[self.r[self.r >= 0]] = computed[self.r >= 0]
        x[self.s[self.s >= 0]] = held[self.s >= 0]
        x[self.free_cols] = [self._free_value(computed, held, f) for f in self.frees]
        self._fill_memory(x, computed)
        return x

    def _free_value(self, computed: np.ndarray, held: np.ndarray, f: FreeVar) -> float:
        """The product R[t,k] (1 - S[t+1,i]) prod (1 - R[t,j]) over later readers j of i."""
        later = (j for j in self.problem.successors[f.i] if f.k < j <= f.t)
        kept = held[f.t + 1, f.i] if f.t + 1 < self.problem.num_ops else f.i in self.problem.graph_outputs
        return float(computed[f.t, f.k] and not kept and not any(computed[f.t, j] for j in later))

    def _fill_memory(self, x: np.ndarray, computed: np.ndarray) -> None:
        """U by its recurrence from R, S and FREE; the peak variable (if any) as the largest need."""
        p, unit = self.problem, self.memory_unit
        freed: dict[tuple[int, int], float] = {}
        for f, col in zip(self.frees, self.free_cols, strict=True):
            freed[f.t, f.k] = freed.get((f.t, f.k), 0.0) + x[col] * p.output_bytes[f.i] / unit
        need = 0.0
        for t in range(p.num_ops):
            memory = p.resident_bytes[self.device] / unit
            memory += sum(x[self.s[t, i]] * p.output_bytes[i] / unit for i in range(t))
            for k in range(t + 1):
                memory += computed[t, k] * p.output_bytes[k] / unit - (freed.get((t, k - 1), 0.0) if k else 0.0)
                x[self.u[t, k]] = memory
                need = max(need, memory + computed[t, k] * p.workspace_bytes[k] / unit)
        if self.peak_col is not None:
            x[self.peak_col] = need


def _matrices(n: int, schedule: Schedule, device: int) -> tuple[np.ndarray, np.ndarray]:
    """R[t,i] and S[t,i] (held when stage t starts) of a schedule, replayed on one device."""
    computed = np.zeros((n, n), dtype=bool)
    held = np.zeros((n, n), dtype=bool)
    present: set[int] = set()
    stage = 0
    for event in schedule.events:
        if isinstance(event, (Compute, Free)) and event.device == device:
            while stage < event.stage:
                stage += 1
                held[stage, list(present)] = True
            if isinstance(event, Compute):
                computed[event.stage, event.op] = True
                present.add(event.op)
            else:
                present.discard(event.op)
    return computed, held


class _Builder:
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

    def build(self) -> SparseMilp:
        shape = (len(self.row_lower), len(self.cost))
        matrix = sparse.csr_matrix((self.entry_vals, (self.entry_rows, self.entry_cols)), shape=shape)
        return SparseMilp(
            cost=np.array(self.cost),
            col_lower=np.array(self.lower),
            col_upper=np.array(self.upper),
            integer=np.array(self.integer, dtype=bool),
            matrix=matrix,
            row_lower=np.array(self.row_lower),
            row_upper=np.array(self.row_upper),
        )


def build_model(problem: Problem, device: int = 0, peak_range: tuple[int, int] | None = None) -> CheckmateModel:
    """The MILP minimizing compute cost within the device's budget, or the peak itself within `peak_range`."""
    n = problem.num_ops
    costs = problem.cost[device]
    cost_unit = max(costs) if max(costs, default=0.0) > 0 else 1.0
    memory_unit = max(1.0, (problem.keep_all_bytes(device) + max(problem.workspace_bytes, default=0)) / MEMORY_STEPS)
    b = _Builder()
    r = _triangle(n, 0, b, integer=True)
    s = _triangle(n, -1, b, integer=True)
    u = _triangle(n, 0, b, integer=False, upper=math.inf)
    frees = tuple(
        FreeVar(t, i, k)
        for t in range(n)
        for k in range(t + 1)
        for i in (*problem.predecessors[k], k)
        if t + 1 < n or i not in problem.graph_outputs
    )
    free_cols = b.columns(len(frees), 0.0, 1.0, integer=False)
    for t in range(n):
        b.lower[r[t, t]] = 1.0
        for i in range(t + 1):
            b.cost[r[t, i]] = 0.0 if peak_range else costs[i] / cost_unit
    _stage_rows(problem, b, r, s)
    _free_rows(problem, b, r, s, frees, free_cols)
    _memory_rows(problem, device, b, (r, s, u), frees, free_cols, memory_unit)
    peak_col = _limit_rows(problem, device, b, r, u, memory_unit, peak_range)
    unit = memory_unit if peak_range else cost_unit
    return CheckmateModel(problem, device, b.build(), r, s, u, frees, free_cols, peak_col, unit, memory_unit)


def _triangle(n: int, diagonal: int, b: _Builder, integer: bool, upper: float = 1.0) -> np.ndarray:
    """An n x n index matrix of new columns on and below `diagonal` (0: i <= t, -1: i < t), else -1."""
    index = np.full((n, n), -1, dtype=np.int64)
    rows, cols = np.tril_indices(n, diagonal)
    index[rows, cols] = b.columns(len(rows), 0.0, upper, integer)
    return index


def _stage_rows(problem: Problem, b: _Builder, r: np.ndarray, s: np.ndarray) -> None:
    """Keep only what was held or computed; compute only from what is held or computed; outputs at the end."""
    n = problem.num_ops
    for t in range(n - 1):
        for i in range(t):
            b.row([int(s[t + 1, i]), int(s[t, i]), int(r[t, i])], [1.0, -1.0, -1.0], -math.inf, 0.0)
    for u, v in set(problem.edges):
        for t in range(v, n):
            b.row([int(r[t, v]), int(r[t, u]), int(s[t, u])], [1.0, -1.0, -1.0], -math.inf, 0.0)
    for i in set(problem.graph_outputs):
        if i < n - 1:
            b.row([int(r[n - 1, i]), int(s[n - 1, i])], [1.0, 1.0], 1.0, math.inf)
    for t in range(n):
        for i in range(t):
            _used_row(problem, b, r, s, t, i)


def _used_row(problem: Problem, b: _Builder, r: np.ndarray, s: np.ndarray, t: int, i: int) -> None:
    """R[t,i] <= readers of i computed later in stage t + S[t+1,i]: a recompute nobody uses is waste.

    Dropping such a recompute never costs more or needs more memory, so the optimum is unchanged;
    the row only removes useless branches and tightens the relaxation.
    """
    n = problem.num_ops
    if t == n - 1 and i in problem.graph_outputs:
        return
    cols = [int(r[t, i])] + [int(r[t, j]) for j in problem.successors[i] if j <= t]
    vals = [1.0] + [-1.0] * (len(cols) - 1)
    if t + 1 < n:
        cols.append(int(s[t + 1, i]))
        vals.append(-1.0)
    b.row(cols, vals, -math.inf, 0.0)


def _free_rows(
    problem: Problem, b: _Builder, r: np.ndarray, s: np.ndarray, frees: tuple[FreeVar, ...], cols: np.ndarray
) -> None:
    """FREE[t,i,k] <= R[t,k], <= 1 - S[t+1,i], <= 1 - R[t,j] for every reader j of i after k in stage t."""
    n = problem.num_ops
    for f, col in zip(frees, cols, strict=True):
        col = int(col)
        b.row([col, int(r[f.t, f.k])], [1.0, -1.0], -math.inf, 0.0)
        if f.t + 1 < n:
            b.row([col, int(s[f.t + 1, f.i])], [1.0, 1.0], -math.inf, 1.0)
        for j in problem.successors[f.i]:
            if f.k < j <= f.t:
                b.row([col, int(r[f.t, j])], [1.0, 1.0], -math.inf, 1.0)


def _memory_rows(
    problem: Problem,
    device: int,
    b: _Builder,
    rsu: tuple[np.ndarray, np.ndarray, np.ndarray],
    frees: tuple[FreeVar, ...],
    free_cols: np.ndarray,
    memory_unit: float,
) -> None:
    """U[t,0] = resident + held + R[t,0] m_0; U[t,k] = U[t,k-1] - freed after k-1 + R[t,k] m_k."""
    r, s, u = rsu
    sizes = [size / memory_unit for size in problem.output_bytes]
    resident = problem.resident_bytes[device] / memory_unit
    freed: dict[tuple[int, int], tuple[list[int], list[float]]] = {}
    for f, col in zip(frees, free_cols, strict=True):
        cols, vals = freed.setdefault((f.t, f.k), ([], []))
        cols.append(int(col))
        vals.append(sizes[f.i])
    for t in range(problem.num_ops):
        cols = [int(u[t, 0]), int(r[t, 0])] + [int(s[t, i]) for i in range(t)]
        vals = [1.0, -sizes[0]] + [-sizes[i] for i in range(t)]
        b.row(cols, vals, resident, resident)
        for k in range(1, t + 1):
            fcols, fvals = freed.get((t, k - 1), ([], []))
            b.row([int(u[t, k]), int(u[t, k - 1]), int(r[t, k]), *fcols], [1.0, -1.0, -sizes[k], *fvals], 0.0, 0.0)


def _limit_rows(
    problem: Problem,
    device: int,
    b: _Builder,
    r: np.ndarray,
    u: np.ndarray,
    memory_unit: float,
    peak_range: tuple[int, int] | None,
) -> int | None:
    """U[t,k] + workspace_k R[t,k] <= the budget, or <= a peak variable B (returned) to minimize.

    The budget gets half a byte of slack: peaks are whole bytes, so this is exact and keeps solver
    tolerances from cutting off a schedule that fits to the byte.
    """
    peak_col = None
    if peak_range is None:
        limit = (problem.budgets[device] + 0.5) / memory_unit
    else:
        peak_col = int(b.columns(1, peak_range[0] / memory_unit, (peak_range[1] + 0.5) / memory_unit, False)[0])
        b.cost[peak_col] = 1.0
        limit = 0.0
    for t in range(problem.num_ops):
        for k in range(t + 1):
            cols = [int(u[t, k]), int(r[t, k])] + ([peak_col] if peak_col is not None else [])
            vals = [1.0, problem.workspace_bytes[k] / memory_unit] + ([-1.0] if peak_col is not None else [])
            b.row(cols, vals, -math.inf, limit)
    return peak_col


def solve_highs(
    milp: SparseMilp,
    time_limit: float | None = None,
    warm_start: np.ndarray | None = None,
    progress: MilpProgress | None = None,
    gaps: tuple[float, float] = (1e-4, 1e-6),
) -> MilpOutcome:
    """Solve with HiGHS on 2 threads; `gaps` are the relative and absolute MIP gaps to stop at."""
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 2)
    h.setOptionValue("random_seed", 0)
    h.setOptionValue("mip_rel_gap", gaps[0])
    h.setOptionValue("mip_abs_gap", gaps[1])
    if time_limit is not None:
        h.setOptionValue("time_limit", float(time_limit))
    h.passModel(_highs_lp(milp))
    if warm_start is not None:
        h.setSolution(len(warm_start), np.arange(len(warm_start), dtype=np.int32), warm_start.astype(np.float64))
    if progress is not None:
        _subscribe_progress(h, progress)
    h.run()
    info = h.getInfo()
    status = {
        highspy.HighsModelStatus.kOptimal: "optimal",
        highspy.HighsModelStatus.kInfeasible: "infeasible",
    }.get(h.getModelStatus(), "time_limit")
    feasible = info.primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible
    x = np.array(h.getSolution().col_value) if feasible else None
    bound = info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else None
    return MilpOutcome(x, status, bound)


def _highs_lp(milp: SparseMilp) -> highspy.HighsLp:
    """The model as a column-wise HighsLp."""
    matrix = milp.matrix.tocsc()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(milp.cost), len(milp.row_lower)
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = milp.cost, milp.col_lower, milp.col_upper
    lp.row_lower_, lp.row_upper_ = milp.row_lower, milp.row_upper
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = matrix.indptr, matrix.indices, matrix.data
    kinds = (highspy.HighsVarType.kContinuous, highspy.HighsVarType.kInteger)
    lp.integrality_ = [kinds[int(flag)] for flag in milp.integer]
    return lp


def _subscribe_progress(h: highspy.Highs, progress: MilpProgress, every: float = 0.5) -> None:
    """Report (time, incumbent, bound) from HiGHS's MIP callbacks, at most every `every` seconds."""
    last = [-math.inf]

    def report(event: highspy.cb.HighsCallbackEvent) -> None:
        out = event.data_out
        if out.running_time - last[0] >= every:
            last[0] = out.running_time
            finite = [v if math.isfinite(v) else None for v in (out.mip_primal_bound, out.mip_dual_bound)]
            progress(out.running_time, *finite)

    h.cbMipInterrupt.subscribe(report)


def solve_cbc(
    milp: SparseMilp,
    time_limit: float | None = None,
    warm_start: np.ndarray | None = None,
    progress: MilpProgress | None = None,
    gaps: tuple[float, float] = (1e-4, 1e-6),
) -> MilpOutcome:
    """Solve with CBC through PuLP on 2 threads (no live progress: reported once at the end)."""
    start = time.perf_counter()
    problem, variables = _pulp_problem(milp)
    if warm_start is not None:
        for variable, value in zip(variables, warm_start, strict=True):
            variable.setInitialValue(round(value) if variable.cat == pulp.LpInteger else value)
    with tempfile.TemporaryDirectory() as directory:
        log = Path(directory) / "cbc.log"
        solver = pulp.PULP_CBC_CMD(
            msg=False, threads=2, timeLimit=time_limit, gapRel=gaps[0], gapAbs=gaps[1],
            warmStart=warm_start is not None, logPath=str(log),
        )
        problem.solve(solver)
        text = log.read_text() if log.exists() else ""
    outcome = _cbc_outcome(problem, variables, text)
    if progress is not None:
        incumbent = None if outcome.x is None else float(milp.cost @ outcome.x)
        progress(time.perf_counter() - start, incumbent, outcome.bound)
    return outcome


def _pulp_problem(milp: SparseMilp) -> tuple[pulp.LpProblem, list[pulp.LpVariable]]:
    """The model as a PuLP problem over variables x0..x{n-1}."""
    problem = pulp.LpProblem("checkmate", pulp.LpMinimize)
    variables = [
        pulp.LpVariable(
            f"x{j}", lowBound=lo, upBound=None if math.isinf(up) else up,
            cat=pulp.LpInteger if integer else pulp.LpContinuous,
        )
        for j, (lo, up, integer) in enumerate(zip(milp.col_lower, milp.col_upper, milp.integer, strict=True))
    ]
    problem += pulp.LpAffineExpression([(variables[j], c) for j, c in enumerate(milp.cost) if c])
    matrix = milp.matrix
    for row, (lower, upper) in enumerate(zip(milp.row_lower, milp.row_upper, strict=True)):
        span = slice(matrix.indptr[row], matrix.indptr[row + 1])
        expression = pulp.LpAffineExpression(
            [(variables[j], v) for j, v in zip(matrix.indices[span], matrix.data[span], strict=True)]
        )
        if lower == upper:
            problem += expression == lower, f"r{row}"
            continue
        if math.isfinite(lower):
            problem += expression >= lower, f"r{row}l"
        if math.isfinite(upper):
            problem += expression <= upper, f"r{row}u"
    return problem, variables


def _cbc_outcome(problem: pulp.LpProblem, variables: list[pulp.LpVariable], log: str) -> MilpOutcome:
    """Status, solution and bound of a finished CBC run, the bound read from CBC's log."""
    if problem.status == pulp.LpStatusInfeasible or "Result - Problem proven infeasible" in log:
        return MilpOutcome(None, "infeasible", None)
    has_solution = problem.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    x = np.array([v.varValue or 0.0 for v in variables]) if has_solution else None
    optimal = "Result - Optimal solution found" in log
    match = re.search(r"^Lower bound:\s*(\S+)", log, re.MULTILINE)
    objective = re.search(r"^Objective value:\s*(\S+)", log, re.MULTILINE)
    bound = float(match.group(1)) if match else float(objective.group(1)) if optimal and objective else None
    if x is None and not optimal and problem.status not in (pulp.LpStatusNotSolved, pulp.LpStatusOptimal):
        raise SolverError(f"CBC ended with status {pulp.LpStatus[problem.status]}")
    return MilpOutcome(x, "optimal" if optimal else "time_limit", bound)
