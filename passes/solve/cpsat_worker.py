"""CP-SAT in its own process (see cpsat.py for why): python cpsat_worker.py MODEL.npz ANSWER.npz.

Reads the integer model written by cpsat.IntegerModel.save, solves it, prints "incumbent bound" (CP-SAT's
integer units, nan when unknown) on stdout whenever either improves, and writes the status name, the
values and the bound to ANSWER.npz. Closing its stdin (child.py) stops the search with the best solution found
so far; SIGINT is ignored, and CP-SAT's own SIGINT handler is off (catch_sigint_signal). It
imports OR-Tools and numpy only, never onnx_remat (whose HiGHS cannot share the process).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time

import numpy as np
from ortools.sat.python import cp_model

STOP_EVERY = 0.05
"""Seconds between the stop thread's calls to stop_search until the search has ended."""


class Reporter(cp_model.CpSolverSolutionCallback):
    """Prints the incumbent and the bound whenever either changes."""

    def __init__(self) -> None:
        super().__init__()
        self.incumbent = math.nan

    def on_solution_callback(self) -> None:
        self.incumbent = self.objective_value
        self.report(self.best_objective_bound)

    def report(self, bound: float) -> None:
        print(self.incumbent, bound, flush=True)


def build(data: np.lib.npyio.NpzFile) -> cp_model.CpModel:
    """The CP-SAT model of the arrays: variable domains, linear rows in CSR form, objective, hint."""
    model = cp_model.CpModel()
    proto = model.proto
    for lower, upper in zip(data["col_lower"].tolist(), data["col_upper"].tolist(), strict=True):
        proto.variables.add().domain.extend([lower, upper])
    indptr, indices, coefficients = data["indptr"], data["indices"].tolist(), data["coefficients"].tolist()
    for row, (lower, upper) in enumerate(zip(data["row_lower"].tolist(), data["row_upper"].tolist(), strict=True)):
        linear = proto.constraints.add().linear
        linear.vars.extend(indices[indptr[row] : indptr[row + 1]])
        linear.coeffs.extend(coefficients[indptr[row] : indptr[row + 1]])
        linear.domain.extend([lower, upper])
    proto.objective.vars.extend(data["objective_cols"].tolist())
    proto.objective.coeffs.extend(data["objective_coefficients"].tolist())
    hint = data["hint"].tolist()
    if hint:
        proto.solution_hint.vars.extend(range(len(hint)))
        proto.solution_hint.values.extend(hint)
    return model


def main(given: str, answer: str) -> None:
    """Solve the model in `given` and write the answer to `answer`."""
    start = time.perf_counter()
    solver = cp_model.CpSolver()
    stopped, solved = threading.Event(), threading.Event()
    _stop_at_eof(solver, stopped, solved)
    with np.load(given) as data:
        model = build(data)
        for name, value in zip(data["parameter_names"].tolist(), data["parameter_values"].tolist(), strict=True):
            setattr(solver.parameters, name, type(getattr(solver.parameters, name))(value))
    solver.parameters.catch_sigint_signal = False
    remaining = solver.parameters.max_time_in_seconds - (time.perf_counter() - start)
    solver.parameters.max_time_in_seconds = 0.0 if stopped.is_set() else max(0.01, remaining)
    reporter = Reporter()
    solver.best_bound_callback = reporter.report
    status = solver.solve(model, reporter)
    solved.set()
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    values = np.array(solver.response_proto.solution if found else [], dtype=np.int64)
    np.savez(answer, status=solver.status_name(status), values=values, bound=solver.best_objective_bound)


def _stop_at_eof(solver: cp_model.CpSolver, stopped: threading.Event, solved: threading.Event) -> None:
    """Ignore SIGINT; once stdin closes set `stopped` and stop `solver`'s search, again every STOP_EVERY seconds
    until `solved`: stop_search does nothing before the search starts, so one call could come too early."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def wait() -> None:
        while os.read(0, 4096):  # the raw descriptor: a buffered reader's lock breaks interpreter shutdown
            pass
        stopped.set()
        while not solved.is_set():
            solver.stop_search()
            solved.wait(STOP_EVERY)

    threading.Thread(target=wait, daemon=True).start()


if __name__ == "__main__":
    main(*sys.argv[1:])
