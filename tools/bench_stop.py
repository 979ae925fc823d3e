"""How fast a solve answers a stop (Ctrl-C) and how well it keeps --time-limit, on a problem whose root LP is long.

The case is tools/bench_solver.py's VGG16 training step on two devices at its budget. Columns, medians of
--repeats: seconds from setting the stop to HiGHS returning, in this process and in its child process; and the
wall-clock seconds of a whole `solve` (warm starts, model building, backend, checking) against its time limit.

Run: python tools/bench_stop.py [--case vgg16] [--stop-after 8] [--time-limit 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from bench_solver import CASES, budget_for, training_problem, two_devices
from rich.console import Console
from rich.table import Table

from onnx_remat.passes.solve import solve
from onnx_remat.passes.solve.checkmate_milp import build_model
from onnx_remat.passes.solve.highs import solve_highs


def stop_latency(milp, stop_after: float, in_process: bool) -> float:
    """Seconds from setting the stop, `stop_after` seconds into a HiGHS solve, to the solve returning."""
    stop, stopped_at = threading.Event(), []

    def press() -> None:
        stopped_at.append(time.perf_counter())
        stop.set()

    timer = threading.Timer(stop_after, press)
    timer.start()
    solve_highs(milp, 600, stop=stop, in_process=in_process)
    timer.cancel()
    return time.perf_counter() - stopped_at[0] if stopped_at else 0.0


def whole_solve_seconds(problem, time_limit: float) -> float:
    start = time.perf_counter()
    solve(problem, "highs", time_limit=time_limit)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", default="vgg16", choices=sorted(CASES))
    parser.add_argument("--stop-after", type=float, default=8.0, help="seconds into the solve to stop (default 8)")
    parser.add_argument("--time-limit", type=float, default=20.0, help="time limit of the whole solve (default 20)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model_name, kwargs, _ = CASES[args.case]
    graph = training_problem(model_name, kwargs)
    problem = two_devices(graph, budget_for(two_devices(graph, graph.keep_all_bytes()))[0])
    milp = build_model(problem).milp
    table = Table(title=f"{args.case}: T={problem.num_ops}, two devices, {len(milp.cost)} columns; medians of "
                        f"{args.repeats}")
    for column in ("measure", "seconds"):
        table.add_column(column, justify="right" if column == "seconds" else "left")
    for label, in_process in (("stop -> return, HiGHS in this process", True), ("stop -> return, HiGHS child", False)):
        seconds = statistics.median(stop_latency(milp, args.stop_after, in_process) for _ in range(args.repeats))
        table.add_row(f"{label} (stop at {args.stop_after:g} s)", f"{seconds:.2f}")
    whole = statistics.median(whole_solve_seconds(problem, args.time_limit) for _ in range(args.repeats))
    table.add_row(f"whole solve with --time-limit {args.time_limit:g}", f"{whole:.2f}")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
