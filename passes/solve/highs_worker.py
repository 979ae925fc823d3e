"""HiGHS on a SparseMilp's arrays, in this process or as a child: python highs_worker.py MODEL.npz ANSWER.npz.

`run` solves the arrays of `model_arrays` (the parent runs it in-process for small models). As a script (see
highs.py for why), it reads those arrays as highs.py saves them, prints "seconds incumbent bound" (model units, nan when
unknown) on stdout at most every half second, writes every improving solution to BEST.npy beside
ANSWER.npz (atomically, so a parent that must kill it still has the best found), and finally writes the
status, the solution and the bound to ANSWER.npz. Closing its stdin (child.py) interrupts HiGHS at its next
callback; SIGINT is ignored. It imports
highspy and numpy only, never onnx_remat, so it starts quickly.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import highspy
import numpy as np

if TYPE_CHECKING:
    from onnx_remat.passes.solve.backend import SparseMilp

Report = Callable[[float, float | None, float | None], None]
"""(seconds, incumbent or None, bound or None), in model units."""

STATUS = {
    highspy.HighsModelStatus.kOptimal: "optimal",
    highspy.HighsModelStatus.kInfeasible: "infeasible",
    highspy.HighsModelStatus.kInterrupt: "interrupted",
}
"""Outcome names of HiGHS's model statuses (values of backend.SolveStatus, which this script does not import);
any other is "time_limit"."""


def quiet_highs() -> highspy.Highs:
    """A silent Highs instance. HiGHS 1.16 prints its banner on the C stdout when the process makes its first
    one, before any option can be set: stdout is pointed at /dev/null meanwhile, so no banner mixes into a
    command's output (or a worker's progress lines)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            h = highspy.Highs()
            h.setOptionValue("output_flag", False)
            return h
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def model_arrays(milp: SparseMilp) -> dict[str, np.ndarray]:
    """The arrays of a SparseMilp (backend.py) that `run` solves: costs, bounds, integrality and the
    matrix column-wise."""
    matrix = milp.matrix.tocsc()
    return {
        "cost": milp.cost,
        "col_lower": milp.col_lower,
        "col_upper": milp.col_upper,
        "integer": milp.integer,
        "row_lower": milp.row_lower,
        "row_upper": milp.row_upper,
        "start": matrix.indptr.astype(np.int32),
        "index": matrix.indices.astype(np.int32),
        "value": matrix.data.astype(np.float64),
    }


def highs_lp(arrays: dict[str, np.ndarray]) -> highspy.HighsLp:
    """The column-wise HighsLp of a model's arrays (see model_arrays)."""
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(arrays["cost"]), len(arrays["row_lower"])
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = arrays["cost"], arrays["col_lower"], arrays["col_upper"]
    lp.row_lower_, lp.row_upper_ = arrays["row_lower"], arrays["row_upper"]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_ = arrays["start"], arrays["index"]
    lp.a_matrix_.value_ = arrays["value"]
    kinds = (highspy.HighsVarType.kContinuous, highspy.HighsVarType.kInteger)
    lp.integrality_ = [kinds[int(flag)] for flag in arrays["integer"]]
    return lp


def run(
    arrays: dict[str, np.ndarray],
    options: dict[str, float],
    warm_start: np.ndarray | None,
    stop: threading.Event,
    report: Report | None = None,
    improved: Callable[[np.ndarray], None] | None = None,
    deadline: float | None = None,
) -> tuple[str, np.ndarray | None, float | None]:
    """Solve on HiGHS with `options` until optimal, `deadline` (time.time()) or `stop`: status, x, bound.

    `report` gets progress at most every half second; `improved` every improving solution (original space)."""
    h = quiet_highs()
    for name, value in options.items():
        h.setOptionValue(name, int(value) if name in ("threads", "random_seed") else float(value))
    if deadline is not None:
        h.setOptionValue("time_limit", max(0.01, deadline - time.time()))
    h.passModel(highs_lp(arrays))
    if warm_start is not None:
        h.setSolution(len(warm_start), np.arange(len(warm_start), dtype=np.int32), warm_start.astype(np.float64))
    _subscribe(h, arrays["cost"], stop, report, improved)
    h.run()
    if warm_start is not None and start_leaked(h, arrays["cost"]):
        return run(arrays, options, None, stop, report, improved, deadline)
    info = h.getInfo()
    feasible = info.primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible
    x = np.array(h.getSolution().col_value) if feasible else None
    bound = info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else None
    status = STATUS.get(h.getModelStatus(), "time_limit")
    if stop.is_set() and status == "time_limit":  # interrupted in the LP, HiGHS may say so or not
        status = "interrupted"
    return status, x, bound


def start_leaked(h: highspy.Highs, cost: np.ndarray) -> bool:
    """Whether HiGHS handed back the MIP start unchanged though it found better: HiGHS 1.16 maps a start into
    its presolved space, may finish there with a better objective (and status optimal), and then returns the
    start's values (seen on 5-operator graphs: objective 6 reported, the returned columns cost 7)."""
    info = h.getInfo()
    if info.primal_solution_status != highspy.SolutionStatus.kSolutionStatusFeasible:
        return False
    returned = float(cost @ np.array(h.getSolution().col_value))
    return returned > info.objective_function_value + 1e-6 * max(1.0, abs(returned))


def _subscribe(
    h: highspy.Highs,
    cost: np.ndarray,
    stop: threading.Event,
    report: Report | None,
    improved: Callable[[np.ndarray], None] | None,
    every: float = 0.5,
) -> None:
    """Interrupt HiGHS (LP, IPM, branch and bound) once `stop` is set; report progress (at once when the incumbent
    improves, so a caller waiting for a target stops HiGHS without delay) and improving solutions.

    The incumbent reported is the cheapest solution handed over, not HiGHS's primal bound: with a MIP start HiGHS
    may find a cheaper one in its presolved space without handing its columns over (see start_leaked), and a
    caller that stopped at that bound was left with the start (a 7-operator graph: bound 9, columns costing 10)."""
    last = [-math.inf, math.inf]  # time and incumbent of the last report
    held = [math.inf]  # cost of the cheapest solution handed over

    def check(event: highspy.HighsCallbackEvent) -> None:
        if stop.is_set():
            event.interrupt()

    def progress(event: highspy.HighsCallbackEvent) -> None:
        check(event)
        out = event.data_out
        improved_now = held[0] < last[1]
        if report is not None and (improved_now or out.running_time - last[0] >= every):
            last[0], last[1] = out.running_time, held[0]
            finite = [v if math.isfinite(v) else None for v in (held[0], out.mip_dual_bound)]
            report(out.running_time, *finite)

    def solution(event: highspy.HighsCallbackEvent) -> None:
        x = np.array(event.data_out.mip_solution, dtype=np.float64)
        held[0] = min(held[0], float(cost @ x))
        if improved is not None:
            improved(x)

    h.cbSimplexInterrupt.subscribe(check)
    h.cbIpmInterrupt.subscribe(check)
    h.cbMipInterrupt.subscribe(progress)
    h.cbMipImprovingSolution.subscribe(solution)


def main(given: str, answer: str) -> None:
    """Solve the model in `given`, streaming progress and improving solutions, and write the answer."""
    stop = _stop_at_eof()
    with np.load(given) as data:
        arrays = {name: data[name] for name in data.files}
    options = dict(zip(arrays.pop("option_names").tolist(), arrays.pop("option_values").tolist(), strict=True))
    deadline = options.pop("deadline", math.nan)
    warm = arrays.pop("warm_start")
    best = Path(answer).with_name("best.npy")

    def report(seconds: float, incumbent: float | None, bound: float | None) -> None:
        print(seconds, math.nan if incumbent is None else incumbent, math.nan if bound is None else bound, flush=True)

    def improved(x: np.ndarray) -> None:
        partial = best.with_name("best.partial.npy")
        np.save(partial, x)
        os.replace(partial, best)

    status, x, bound = run(
        arrays, options, warm if len(warm) else None, stop, report, improved, None if math.isnan(deadline) else deadline
    )
    values = np.zeros(0) if x is None else x
    np.savez(answer, status=status, x=values, bound=math.nan if bound is None else bound)


def _stop_at_eof() -> threading.Event:
    """An event set once stdin closes (the parent's stop, child.py), from a thread: the main thread is in HiGHS,
    which in a root LP may not run Python for tens of seconds. SIGINT is ignored: the parent handles Ctrl-C."""
    stop = threading.Event()
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def wait() -> None:
        while os.read(0, 4096):  # the raw descriptor: a buffered reader's lock breaks interpreter shutdown
            pass
        stop.set()

    threading.Thread(target=wait, daemon=True).start()
    return stop


if __name__ == "__main__":
    main(*sys.argv[1:])
