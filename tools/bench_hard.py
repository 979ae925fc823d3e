"""Small single-device training steps just above their minimum budget: how fast each backend proves them.

Problems of 20-60 operators with heterogeneous costs, workspaces, resident memory and graph outputs (a user's
training step, not a synthetic chain) can be hard to prove near their minimum: issue 14's concat22 (22 operators at
49 MiB, minimum 48.05 MiB) took HiGHS 44 s. The family: the problem files given (`onnx-remat ... --emit-problem`)
and the training steps of a few small hand-built graphs (GRAPHS), each at its minimum budget and at the given
percentages above it. Per problem, budget and solver: status, objective and bound (ms), seconds (median over
--repeats), and the backend's own seconds (HiGHS on the Checkmate MILP without warm start, the root of
every solve) beside the whole `solve()` (warm starts, memory-cut bound, the portfolio for "auto").

Run: python tools/bench_hard.py [--problems A.json,B.json] [--above 1,5] [--solvers milp,auto] [--repeats 3]
     [--time-limit 60] [--no-graphs]
For a "before" column beside it, run it at the same time with PYTHONPATH at an older tree (`git archive` of a
commit, with onnx_remat/passes a link to its passes/): the package, and the command line it starts, are then that
tree's.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_remat.core.problem import Problem
from onnx_remat.passes.simulate import check_schedule
from onnx_remat.passes.solve import solve
from onnx_remat.passes.solve.baselines import prune_unread
from onnx_remat.passes.solve.checkmate_milp import build_model
from onnx_remat.passes.solve.highs import solve_highs
from onnx_remat.passes.solve.min_budget import minimum_budget
from onnx_remat.problem_file import read_problem

GRAPHS: dict[str, tuple[str, int, int]] = {
    "concat": ("concat", 512, 1024),
    "concat_small": ("concat", 256, 512),
    "residual": ("residual", 512, 1024),
    "gated": ("gated", 512, 1024),
}
"""Name: block, rows and width of the hand-built graphs whose training steps join the family (20-40 operators):
"concat" is issue 14's concat22 (x * w0 beside MatMul, Tanh, MatMul; Concat; Tanh), "residual" two MLP blocks
with skips, "gated" a gated linear unit."""


def block_graph(block: str, rows: int, width: int) -> onnx.ModelProto:
    """A small float32 graph on x [rows, width] with hidden width 2 * width (GRAPHS)."""
    rng = np.random.default_rng(0)
    weights: list[onnx.TensorProto] = []

    def weight(name: str, *shape: int) -> str:
        weights.append(numpy_helper.from_array((0.02 * rng.standard_normal(shape)).astype(np.float32), name))
        return name

    hidden = 2 * width
    blocks = {
        "concat": lambda: [
            ("Mul", ["x", weight("w0", width)], "a"), ("MatMul", ["x", weight("up", width, hidden)], "b0"),
            ("Tanh", ["b0"], "b1"), ("MatMul", ["b1", weight("down", hidden, width)], "b"),
            ("Concat", ["a", "b"], "c"), ("Tanh", ["c"], "y")],
        "residual": lambda: [
            ("MatMul", ["x", weight("up0", width, hidden)], "h0"), ("Tanh", ["h0"], "t0"),
            ("MatMul", ["t0", weight("down0", hidden, width)], "d0"), ("Add", ["x", "d0"], "r0"),
            ("MatMul", ["r0", weight("up1", width, hidden)], "h1"), ("Relu", ["h1"], "t1"),
            ("MatMul", ["t1", weight("down1", hidden, width)], "d1"), ("Add", ["r0", "d1"], "y")],
        "gated": lambda: [
            ("MatMul", ["x", weight("wa", width, hidden)], "ga"), ("Sigmoid", ["ga"], "sa"),
            ("MatMul", ["x", weight("wb", width, hidden)], "gb"), ("Tanh", ["gb"], "tb"),
            ("Mul", ["sa", "tb"], "g"), ("MatMul", ["g", weight("wo", hidden, width)], "y")],
    }
    nodes = blocks[block]()
    made = [helper.make_node(op, inputs, [output], axis=1) if op == "Concat"
            else helper.make_node(op, inputs, [output]) for op, inputs, output in nodes]
    width_out = 2 * width if block == "concat" else width
    graph = helper.make_graph(made, block, [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [rows, width])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [rows, width_out])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@dataclass(frozen=True)
class Run:
    """One solve: how it ended, its objective and bound (seconds), its wall time."""

    status: str
    objective: float | None
    bound: float | None
    seconds: float


def emitted_problem(model: onnx.ModelProto, directory: Path, name: str) -> Problem:
    """The training step's problem at its minimum budget as the command line builds it (--emit-problem), with the
    roofline's costs."""
    graph, problem = directory / f"{name}.onnx", directory / f"{name}.problem.json"
    onnx.save(model, graph)
    command = [str(Path(sys.executable).with_name("onnx-remat")), str(graph), str(directory / f"{name}.out.onnx"),
               "--mode", "train", "--budget", "min", "--cost-model", "analytic", "--time-limit", "30",
               "--emit-problem", str(problem), "--force", "-q"]
    subprocess.run(command, check=True)
    return read_problem(problem)


def run_milp(problem: Problem, time_limit: float) -> Run:
    """HiGHS alone on the MILP, no warm start: what the formulation proves by itself (its schedule's unread
    computations pruned and the bound clamped to the objective, as solve() does)."""
    model = build_model(problem)
    start = time.perf_counter()
    outcome = solve_highs(model.milp, time_limit)
    seconds = time.perf_counter() - start
    schedule = None if outcome.x is None else prune_unread(problem, model.schedule(outcome.x))
    objective = None if schedule is None else check_schedule(problem, schedule).total_cost
    bound = None if outcome.bound is None else outcome.bound * model.objective_unit
    if bound is not None and objective is not None:
        bound = min(bound, objective)  # a bound on the frontier-advancing form, which pruning can undercut
    return Run(str(outcome.status), objective, bound, seconds)


def run_solve(problem: Problem, solver: str, time_limit: float) -> Run:
    """The whole solve() as the command line runs it."""
    start = time.perf_counter()
    result = solve(problem, solver, time_limit)
    return Run(str(result.status), result.objective, result.bound, time.perf_counter() - start)


def median_run(runs: list[Run]) -> Run:
    """The weakest status, the worst objective, the lowest bound and the median seconds of repeated runs."""
    objectives = [r.objective for r in runs if r.objective is not None]
    bounds = [r.bound for r in runs if r.bound is not None]
    status = runs[0].status if all(r.status == runs[0].status for r in runs) else "/".join(r.status for r in runs)
    return Run(status, max(objectives, default=None), min(bounds, default=None),
               statistics.median(r.seconds for r in runs))


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.3f}"


def family(files: list[Path], graphs: bool, directory: Path) -> dict[str, Problem]:
    """The problems by name: the files, then the hand-built graphs' training steps (written to `directory`)."""
    problems = {path.stem.removesuffix(".problem"): read_problem(path) for path in files}
    if graphs:
        problems |= {name: emitted_problem(block_graph(*GRAPHS[name]), directory, name) for name in GRAPHS}
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default="", help="problem files, comma-separated")
    parser.add_argument("--above", default="1,5", help="percentages above each problem's minimum budget")
    parser.add_argument("--solvers", default="milp,auto", help="milp (HiGHS alone on the MILP) and solve() backends")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--no-graphs", action="store_true", help="only the problem files")
    args = parser.parse_args()
    files = [Path(p) for p in args.problems.split(",") if p]
    print("| problem | ops | budget | solver | status | objective ms | bound ms | seconds |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as directory:
        problems = family(files, not args.no_graphs, Path(directory))
    for name, problem in problems.items():
        least = minimum_budget(problem, 0).feasible
        for above in [0.0, *(float(p) for p in args.above.split(",") if p)]:
            budget = int(least * (1 + above / 100))
            at = replace(problem, budgets=(budget,))
            for solver in args.solvers.split(","):
                runs = [run_milp(at, args.time_limit) if solver == "milp" else run_solve(at, solver, args.time_limit)
                        for _ in range(args.repeats)]
                row = median_run(runs)
                label = f"min+{above:g}% ({budget / 2**20:.2f} MiB)"
                print(f"| {name} | {problem.num_ops} | {label} | {solver} | {row.status} | {ms(row.objective)} | "
                      f"{ms(row.bound)} | {row.seconds:.2f} |", flush=True)


if __name__ == "__main__":
    main()
