"""CP-SAT in its own process (see cpsat.py for why): python cpsat_worker.py MODEL.npz ANSWER.npz.

Reads one of two models, solves it, prints "incumbent bound" (CP-SAT's integer units, nan when unknown) on stdout
whenever either improves, and writes the status name, the values and the bound to ANSWER.npz:
- the MILP's integer arrays (cpsat.IntegerModel.save); the values are the solution vector;
- a single-device problem's arrays (interval.py), for Moccasin's formulation (ICML'23) on retention intervals:
  operator v has up to copies[v] computations, each an optional interval from the step that computes it to the
  last step that reads it; one computation per step, every reader's step inside an interval of each input, the
  intervals' sizes within the free memory at every step (a cumulative; the capacity less what the runtime keeps
  for first computations, and a recomputation's kept bytes an interval over the whole horizon), first computations
  in operator order (the frontier-advancing form); the values are the operators computed, in execution order.
Started with no arguments (child.started_early), it imports and then reads them as one JSON line on stdin.
Closing its stdin (child.py) stops the search with the best solution found
so far; SIGINT is ignored, and CP-SAT's own SIGINT handler is off (catch_sigint_signal). It
imports OR-Tools and numpy only, never onnx_remat (whose HiGHS cannot share the process).
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model_helper as cmh

STOP_EVERY = 0.05
"""Seconds between the stop thread's calls to stop_search until the search has ended."""
FIRST_COPIES = 2
"""Computations per operator in the interval model's first search (Moccasin's C=2): the peers' 41-operator training
chains reach their optimum 0.2-0.3 s sooner with 2 than with 3 (0.41-0.52 s against 0.64-0.78 s, measured)."""
FIRST_SECONDS = 0.3
"""Shortest stall, in seconds, that ends the first search (see _run_until_stalled). The peers' U-Net at 60% of its
peak (75.278, optimum needing 3): 1.97-2.03 s with 0.3, 2.25-2.44 s with 0.5, 2.0-4.3 s with 1.0, 2.0-2.4 s without
the first search; the chains are as fast with 0.3 as with 0.5 (measured, interleaved)."""
FIRST_WAIT = 1.5
"""Longest wait, in seconds, for the first search's first solution, after which the full model runs instead (where
fewer computations admit no schedule). Presolve alone takes 0.3 s on the peers' U-Net beside HiGHS: a stall counted
from the search's start stopped it there, without a solution, and the full model's first came 2.3 s later."""
INFINITY = 2**63 - 1
"""CP-SAT's unbounded end of a linear constraint's domain."""
SOLVED = (cmh.CpSolverStatus.OPTIMAL, cmh.CpSolverStatus.FEASIBLE)
"""The statuses of a search that found a solution."""


class Reporter(cmh.SolutionCallback):
    """Prints the incumbent and the bound whenever either changes; `found_at`: when the incumbent was found, on
    `clock`."""

    def __init__(self) -> None:
        super().__init__()
        self.incumbent = math.nan
        self.clock: Callable[[], float] = time.perf_counter
        self.found_at = self.clock()

    def OnSolutionCallback(self) -> None:  # noqa: N802  # the name CP-SAT calls
        self.incumbent = self.ObjectiveValue()
        self.found_at = self.clock()
        self.report(self.BestObjectiveBound())

    def report(self, bound: float) -> None:
        print(self.incumbent, bound, flush=True)


class Solver:
    """CP-SAT's searches of one process, stoppable from other threads: OR-Tools' CpSolver on its native helper, without
    the cp_model layer, which imports pandas (the worker's start-up 0.56-0.66 s with it, 0.28-0.39 s without;
    measured)."""

    def __init__(self) -> None:
        self.parameters = cmh.SatParameters()
        self.lock = threading.Lock()
        self.wrapper: cmh.SolveWrapper | None = None
        self.response = cmh.CpSolverResponse()

    def solve(self, model: Model, reporter: Reporter) -> cmh.CpSolverStatus:
        """Search `model` with the parameters, reporting to `reporter`; the response stays in `response`."""
        wrapper = cmh.SolveWrapper()
        wrapper.set_parameters(self.parameters)
        wrapper.add_solution_callback(reporter)
        wrapper.add_best_bound_callback(reporter.report)
        with self.lock:
            self.wrapper = wrapper
        try:
            self.response = wrapper.solve(model.proto)
        finally:
            wrapper.clear_solution_callback(reporter)
            with self.lock:
                self.wrapper = None
        return self.response.status

    def stop_search(self) -> None:
        """Stop the running search, if one is running."""
        with self.lock:
            if self.wrapper is not None:
                self.wrapper.stop_search()

    def value(self, variable: int) -> int:
        return self.response.solution[variable]


def negated(literal: int) -> int:
    """The literal that is true when `literal` is false (CP-SAT's encoding)."""
    return -literal - 1


class Model:
    """A CP-SAT model proto and the few ways of building it these models use; variables are their indices."""

    def __init__(self) -> None:
        self.proto = cmh.CpModelProto()

    def variable(self, values: list[int]) -> int:
        """An integer variable taking `values` (sorted), stored as CP-SAT's domain of disjoint ranges."""
        domain: list[int] = []
        for value in values:
            if domain and value == domain[-1] + 1:
                domain[-1] = value
            else:
                domain.extend([value, value])
        return self.ranged(domain)

    def ranged(self, domain: list[int]) -> int:
        """An integer variable whose domain is the ranges [a, b, c, d...] (a to b, c to d)."""
        self.proto.variables.add().domain.extend(domain)
        return len(self.proto.variables) - 1

    def boolean(self) -> int:
        return self.ranged([0, 1])

    def linear(self, terms: list[tuple[int, int]], lower: int, upper: int, enforced: list[int]) -> None:
        """lower <= sum(coefficient * variable) <= upper where every literal of `enforced` is true."""
        constraint = self.proto.constraints.add()
        constraint.enforcement_literal.extend(enforced)
        constraint.linear.vars.extend(v for v, _ in terms)
        constraint.linear.coeffs.extend(c for _, c in terms)
        constraint.linear.domain.extend([lower, upper])

    def clause(self, literals: list[int], enforced: list[int]) -> None:
        """One of `literals` is true where every literal of `enforced` is."""
        constraint = self.proto.constraints.add()
        constraint.enforcement_literal.extend(enforced)
        constraint.bool_or.literals.extend(literals)

    def interval(self, start: int, size: int | None, end: int | None, present: int) -> int:
        """An optional interval from `start` to `end` (variables) of `size` (variable), or of size 1 where both
        are None; its constraint's index."""
        constraint = self.proto.constraints.add()
        constraint.enforcement_literal.append(present)
        interval = constraint.interval
        interval.start.vars.append(start)
        interval.start.coeffs.append(1)
        if size is None or end is None:
            interval.size.offset = 1
            interval.end.vars.append(start)
            interval.end.coeffs.append(1)
            interval.end.offset = 1
        else:
            interval.size.vars.append(size)
            interval.size.coeffs.append(1)
            interval.end.vars.append(end)
            interval.end.coeffs.append(1)
        return len(self.proto.constraints) - 1

    def cumulative(self, intervals: list[int], demands: list[int], capacity: int) -> None:
        """The demands of the present intervals covering any point sum to at most `capacity`."""
        cumulative = self.proto.constraints.add().cumulative
        cumulative.capacity.offset = capacity
        cumulative.intervals.extend(intervals)
        for demand in demands:
            cumulative.demands.add().offset = demand

    def minimize(self, terms: list[tuple[int, int]]) -> None:
        self.proto.objective.vars.extend(v for v, _ in terms)
        self.proto.objective.coeffs.extend(c for _, c in terms)

    def hint(self, variable: int, value: int) -> None:
        self.proto.solution_hint.vars.append(variable)
        self.proto.solution_hint.values.append(value)


def build(data: dict[str, np.ndarray]) -> Model:
    """The CP-SAT model of the arrays: variable domains, linear rows in CSR form, objective, hint."""
    model = Model()
    for lower, upper in zip(data["col_lower"].tolist(), data["col_upper"].tolist(), strict=True):
        model.ranged([lower, upper])
    indptr, indices, coefficients = data["indptr"], data["indices"].tolist(), data["coefficients"].tolist()
    for row, (lower, upper) in enumerate(zip(data["row_lower"].tolist(), data["row_upper"].tolist(), strict=True)):
        span = slice(indptr[row], indptr[row + 1])
        model.linear(list(zip(indices[span], coefficients[span], strict=True)), lower, upper, [])
    model.minimize(list(zip(data["objective_cols"].tolist(), data["objective_coefficients"].tolist(), strict=True)))
    for variable, value in enumerate(data["hint"].tolist()):
        model.hint(variable, value)
    return model


@dataclass
class Computation:
    """One optional computation of an operator: whether it happens, its step, the last step it is held (variables)."""

    present: int
    start: int
    end: int


def event(op: int, stage: int) -> int:
    """The step of computing `op` in `stage`: stage s holds a step for each operator up to s, in operator order (the
    MILP's frontier-advancing form, Moccasin's use_stage), so distinct computations never share a step."""
    return stage * (stage + 1) // 2 + op


def computations(model: Model, copies: list[int]) -> list[list[Computation]]:
    """Each operator's computations: the first present and the last step of stage v, each later one in a later
    stage, after its predecessor is freed."""
    n = len(copies)
    horizon = n * (n + 1) // 2
    ops: list[list[Computation]] = []
    for v, count in enumerate(copies):
        own: list[Computation] = []
        for i in range(count):
            present = model.ranged([1, 1]) if i == 0 else model.boolean()
            steps = [event(v, v)] if i == 0 else [event(v, stage) for stage in range(v + 1 + (i - 1), n)]
            start = model.variable(steps)
            end = model.ranged([steps[0] + 1, horizon])
            if i > 0:
                model.clause([own[-1].present], [present])
                model.linear([(start, 1), (own[-1].end, -1)], 0, INFINITY, [present])
            own.append(Computation(present, start, end))
        ops.append(own)
    return ops


def build_intervals(data: dict[str, np.ndarray]) -> tuple[Model, list[list[Computation]]]:
    """The interval model of the problem arrays, minimizing the (integer-scaled) cost of recomputations."""
    model = Model()
    ops = computations(model, data["copies"].tolist())
    edges = data["edges"].tolist()
    _inputs_held(model, ops, edges)
    _recomputations_read(model, ops, edges, set(data["outputs"].tolist()))
    _memory(model, ops, data)
    _outputs_kept(model, ops, data["outputs"].tolist(), len(ops) * (len(ops) + 1) // 2)
    costs = data["costs"].tolist()
    model.minimize([(c.present, costs[v]) for v, own in enumerate(ops) for c in own[1:]])
    _add_hint(model, ops, data["hint"].tolist())
    return model, ops


def _within(model: Model, inner: int, outer: Computation, flag: int) -> None:
    """Where `flag` holds, `outer` is present and the step `inner` lies after its start and before its end."""
    model.clause([outer.present], [flag])
    model.linear([(inner, 1), (outer.start, -1)], 1, INFINITY, [flag])
    model.linear([(outer.end, 1), (inner, -1)], 1, INFINITY, [flag])


def _inputs_held(model: Model, ops: list[list[Computation]], edges: list[list[int]]) -> None:
    """Every computation of v reads, for each input u, a computation of u started before it and held through it."""
    for u, v in edges:
        for reader in ops[v]:
            serving = []
            for source in ops[u]:
                serves = model.boolean()
                _within(model, reader.start, source, serves)
                serving.append(serves)
            model.clause(serving, [reader.present])


def _recomputations_read(model: Model, ops: list[list[Computation]], edges: list[list[int]], outputs: set[int]) -> None:
    """A recomputation of an operator that is no graph output is held until some reader runs (else it only costs):
    a valid inequality that prunes the search (Moccasin's "tighten")."""
    readers: list[list[int]] = [[] for _ in ops]
    for u, v in edges:
        readers[u].append(v)
    for u, own in enumerate(ops):
        if u in outputs or not readers[u]:
            continue
        for c in own[1:]:
            flags = []
            for v in readers[u]:
                for r in ops[v]:
                    flag = model.boolean()
                    model.clause([r.present], [flag])
                    _within(model, r.start, c, flag)
                    flags.append(flag)
            model.clause(flags, [c.present])


def _memory(model: Model, ops: list[list[Computation]], data: dict[str, np.ndarray]) -> None:
    """The outputs held, the running operator's workspace and what the runtime keeps for recomputations (held at
    every step) within the capacity at every step."""
    horizon = len(ops) * (len(ops) + 1) // 2
    first, whole, last = model.ranged([0, 0]), model.ranged([horizon, horizon]), model.ranged([horizon, horizon])
    held, sizes = [], []
    for v, own in enumerate(ops):
        for i, c in enumerate(own):
            length = model.ranged([1, horizon])
            held.append(model.interval(c.start, length, c.end, c.present))
            sizes.append(int(data["sizes"][v]))
            if data["workspace"][v] > 0:
                held.append(model.interval(c.start, None, None, c.present))
                sizes.append(int(data["workspace"][v]))
            if i > 0 and data["kept"][v] > 0:
                held.append(model.interval(first, whole, last, c.present))
                sizes.append(int(data["kept"][v]))
    model.cumulative(held, sizes, int(data["capacity"]))


def _outputs_kept(model: Model, ops: list[list[Computation]], outputs: list[int], horizon: int) -> None:
    """A graph output's last computation is held to the end."""
    for v in outputs:
        for i, c in enumerate(ops[v]):
            last = [c.present] + ([negated(ops[v][i + 1].present)] if i + 1 < len(ops[v]) else [])
            model.linear([(c.end, 1)], horizon, horizon, last)


def steps_of(solver: Solver, ops: list[list[Computation]]) -> np.ndarray:
    """The operators of the solution's computations in execution order."""
    done = [(solver.value(c.start), v) for v, own in enumerate(ops) for c in own if solver.value(c.present)]
    return np.array([v for _, v in sorted(done)], dtype=np.int64)


def _add_hint(model: Model, ops: list[list[Computation]], hint: list[list[int]]) -> None:
    """Hint the computations of a known schedule (its (operator, stage) pairs in execution order), if one was given."""
    seen = [0] * len(ops)
    for v, stage in hint:
        if seen[v] < len(ops[v]):
            c = ops[v][seen[v]]
            model.hint(c.start, event(v, stage))
            if seen[v] > 0:
                model.hint(c.present, 1)
            seen[v] += 1
    for v, own in enumerate(ops):
        for c in own[max(1, seen[v]) :]:
            model.hint(c.present, 0)


def main(given: str, answer: str) -> None:
    """Solve the model in `given` (the MILP's arrays, or with "copies" the interval model's) and write the answer."""
    start = time.perf_counter()
    solver = Solver()
    stopped, solved = threading.Event(), threading.Event()
    _stop_at_eof(solver, stopped, solved)
    with np.load(given) as found:
        data = {name: found[name] for name in found.files}
    for name, value in zip(data["parameter_names"].tolist(), data["parameter_values"].tolist(), strict=True):
        setattr(solver.parameters, name, type(getattr(solver.parameters, name))(value))
    solver.parameters.catch_sigint_signal = False
    deadline = start + solver.parameters.max_time_in_seconds
    if "wall_deadline" in data:  # the caller's clock: this process's start-up (importing OR-Tools) counts too
        deadline = min(deadline, start + float(data["wall_deadline"]) - time.time())
    reporter = Reporter()
    if "copies" in data:
        status, values = solve_intervals(solver, data, reporter, stopped, deadline)
    else:
        outcome = _run(solver, build(data), reporter, stopped, deadline)
        status = outcome.name
        values = np.array(solver.response.solution if outcome in SOLVED else [], dtype=np.int64)
    solved.set()
    np.savez(answer, status=status, values=values, bound=solver.response.best_objective_bound)


def _run(
    solver: Solver, model: Model, reporter: Reporter, stopped: threading.Event, deadline: float
) -> cmh.CpSolverStatus:
    """Solve `model` until `deadline` (perf_counter), at once if stopped: CP-SAT's status."""
    left = deadline - time.perf_counter()
    solver.parameters.max_time_in_seconds = 0.0 if stopped.is_set() else max(0.01, left)
    return solver.solve(model, reporter)


def _run_until_stalled(
    solver: Solver,
    model: Model,
    reporter: Reporter,
    stopped: threading.Event,
    deadline: float,
    least: float,
    wait: float,
    clock: Callable[[], float] = time.perf_counter,
) -> cmh.CpSolverStatus:
    """Solve `model` until `deadline`, or until its incumbent has not improved for as long as finding it took, and
    for `least` seconds at least (or `wait` seconds have passed without one), all on `clock`: a search still
    improving goes on. On the peers' chain40_p40 the smaller model found 346.441 in 15 s, the full one 346.651 in
    58 s (CP-SAT alone, each 60 s, the machine loaded)."""
    reporter.clock = clock
    start, ended = clock(), threading.Event()
    reporter.found_at = start

    def watch() -> None:
        while not ended.wait(STOP_EVERY):
            found, now = reporter.found_at, clock()
            stalled = found > start and now - found >= max(least, found - start)
            if stalled or (found == start and now - start >= wait):
                solver.stop_search()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        return _run(solver, model, reporter, stopped, deadline)
    finally:
        ended.set()
        watcher.join()


def solve_intervals(
    solver: Solver, data: dict[str, np.ndarray], reporter: Reporter, stopped: threading.Event, deadline: float
) -> tuple[str, np.ndarray]:
    """The interval model's status and schedule (operators in execution order): first with at most FIRST_COPIES
    computations per operator until that search stalls, then with all of `data`'s copies, hinted with the first's
    schedule, until the limit or, where `data`'s stall_seconds is a number, until that search stalls too, counted in
    this process's CPU seconds (a loaded machine slows the search, not the rule); the first's schedule stands (as
    FEASIBLE) where the second finds nothing cheaper."""
    first: tuple[float, np.ndarray] | None = None
    fewer = {**data, "copies": np.minimum(data["copies"], FIRST_COPIES)}
    if (fewer["copies"] < data["copies"]).any():
        model, ops = build_intervals(fewer)
        if _run_until_stalled(solver, model, reporter, stopped, deadline, FIRST_SECONDS, FIRST_WAIT) in SOLVED:
            first = (solver.response.objective_value, steps_of(solver, ops))
            data = {**data, "hint": stages_of(first[1], len(ops))}
    model, ops = build_intervals(data)
    stall = float(data["stall_seconds"])
    if math.isnan(stall):
        status = _run(solver, model, reporter, stopped, deadline)
    else:
        status = _run_until_stalled(solver, model, reporter, stopped, deadline, stall, stall, time.process_time)
    if status in SOLVED and (first is None or solver.response.objective_value <= first[0]):
        return status.name, steps_of(solver, ops)
    if first is not None:
        return "FEASIBLE", first[1]
    return status.name, np.zeros(0, dtype=np.int64)


def stages_of(steps: np.ndarray, n: int) -> np.ndarray:
    """The (operator, stage) pairs of computing `steps` in order, as hints are given: stage t ends with operator t's
    first computation (interval.schedule_of)."""
    pairs, frontier = [], 0
    for op in steps.tolist():
        pairs.append((op, min(frontier, n - 1)))
        frontier += op == frontier
    return np.array(pairs, dtype=np.int64).reshape(-1, 2)


def _stop_at_eof(solver: Solver, stopped: threading.Event, solved: threading.Event) -> None:
    """Once stdin closes set `stopped` and stop `solver`'s search, again every STOP_EVERY seconds until `solved`:
    stop_search does nothing before the search starts, so one call could come too early."""

    def wait() -> None:
        while os.read(0, 4096):  # the raw descriptor: a buffered reader's lock breaks interpreter shutdown
            pass
        stopped.set()
        while not solved.is_set():
            solver.stop_search()
            solved.wait(STOP_EVERY)

    threading.Thread(target=wait, daemon=True).start()


def arguments_from_stdin() -> list[str]:
    """The arguments of a worker started early (child.started_early): one JSON line on stdin, read byte by byte from
    the raw descriptor so the stop thread reads the rest; none if stdin closed first (it was not needed)."""
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            return []
        line += byte
    return json.loads(line)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides (child.py), also while this waits for arguments
    given = sys.argv[1:] or arguments_from_stdin()
    if given:
        main(*given)
    sys.stdout.flush()
    os._exit(0)  # the answer is written: the interpreter's shutdown with OR-Tools loaded takes 65 ms (measured)
