"""The minimum-budget search at several time limits on problem files: what it finds, what it proves, in how long.

For each problem (a file `onnx-remat --emit-problem` or `onnx-remat solve` reads) and each limit, prints a markdown
row: the minimum found and the lower bound proven (MiB), and the search's wall seconds. The heuristics' part is
bounded by work, so the minimum found at a limit of 0 is the eviction heuristic's search's (or a baseline's) on any
machine; the MILP improves on it with what the limit leaves.

Run: python tools/bench_min_budget.py PROBLEM.json [PROBLEM.json ...] [--limits 0,1,10]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from onnx_remat.passes.solve.min_budget import minimum_budget
from onnx_remat.problem_file import read_problem

MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problems", nargs="+", type=Path)
    parser.add_argument("--limits", default="0,1,10", help="comma-separated seconds")
    args = parser.parse_args()
    limits = [float(limit) for limit in args.limits.split(",")]
    print("| problem | operators | limit s | minimum found MiB | proven at least MiB | wall s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for path in args.problems:
        problem = read_problem(path)
        for limit in limits:
            started = time.perf_counter()
            found = minimum_budget(problem, 0, limit)
            wall = time.perf_counter() - started
            print(f"| {path.stem} | {problem.num_ops} | {limit:g} | {found.feasible / MIB:.3f} "
                  f"| {found.lower / MIB:.3f} | {wall:.2f} |", flush=True)


if __name__ == "__main__":
    main()
