"""HiGHS alone on the MILP against its stage relaxation (passes/solve/lazy.py), on problem files, interleaved.

For each problem and repeat, runs HiGHS (2 threads) on the full MILP and on the relaxation with no stage followed
(build_model(stages=())), the order alternating, each up to --time-limit seconds, and prints a markdown table: the
model's size, its LP relaxation's optimum, the status, the best schedule's cost (the simulator's), its bound, the
seconds, and whether the schedule fits the budget when replayed (the relaxation's may not: lazy.py then follows the
stages it exceeds). Costs are printed in milliseconds.

Run: python tools/bench_relaxation.py PROBLEM.json... [--time-limit 120] [--repeats 1]
     (problem files in the project's format, `onnx-remat --emit-problem`, or the peers' neutral one, /tmp/peers/*.json)
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import highspy
from bench_peers import PEERS

from onnx_remat.core.problem import Problem
from onnx_remat.passes.simulate import simulate
from onnx_remat.passes.solve.checkmate_milp import CheckmateModel, build_model
from onnx_remat.passes.solve.highs import solve_highs
from onnx_remat.passes.solve.highs_worker import highs_lp, model_arrays, quiet_highs
from onnx_remat.problem_file import problem_from_json

GAPS = (2e-6, 1e-6)
"""The solve's own gaps (passes/solve OPTIMALITY_GAP)."""


def load(path: str) -> Problem:
    """A problem file in the project's format, or in the peers' neutral one (converted as their runner does)."""
    data = json.loads(Path(path).read_text())
    if data.get("format") == "remat-problem/v1":
        sys.path.insert(0, str(PEERS))
        from run_onnx_remat import convert

        data = json.loads(json.dumps(convert(data)))  # its edges are tuples, the format's are lists
    return problem_from_json(data, path)


def lp_optimum(model: CheckmateModel) -> float:
    """The LP relaxation's optimum in seconds."""
    lp = highs_lp(model_arrays(model.milp))
    lp.integrality_ = [highspy.HighsVarType.kContinuous] * lp.num_col_
    h = quiet_highs()
    h.passModel(lp)
    h.run()
    return h.getInfo().objective_function_value * model.objective_unit


def row(problem: Problem, name: str, form: str, time_limit: float) -> str:
    """One table row: HiGHS on `form` ("MILP" or "relaxation") of `problem`."""
    model = build_model(problem, stages=None if form == "MILP" else ())
    milp = model.milp
    started = time.perf_counter()
    outcome = solve_highs(milp, time_limit, gaps=GAPS, stop=threading.Event())
    seconds = time.perf_counter() - started
    cost, fits = "-", "-"
    if outcome.x is not None:
        simulation = simulate(problem, model.schedule(outcome.x))
        cost, fits = f"{simulation.total_cost * 1e3:.3f}", "yes" if simulation.fits(problem.budgets) else "no"
    bound = "-" if outcome.bound is None else f"{outcome.bound * model.objective_unit * 1e3:.3f}"
    cells = [name, form, str(len(milp.cost)), str(len(milp.row_lower)), str(milp.matrix.nnz),
             f"{lp_optimum(model) * 1e3:.3f}", str(outcome.status), cost, bound, f"{seconds:.1f}", fits]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="+", help="problem files (the project's format)")
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per HiGHS run (default 120)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per problem and form (default 1)")
    args = parser.parse_args()
    print(f"HiGHS alone, 2 threads, time limit {args.time_limit} s; costs and bounds in ms")
    print("| problem | form | columns | rows | nonzeros | LP | status | cost | bound | s | fits |")
    print("|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|")
    for number, path in enumerate(args.problems):
        problem = load(path)
        for repeat in range(args.repeats):
            forms = ["MILP", "relaxation"][:: 1 if (number + repeat) % 2 == 0 else -1]
            for form in forms:
                print(row(problem, Path(path).stem, form, args.time_limit), flush=True)


if __name__ == "__main__":
    main()
