"""Solve times of the multi-device MILP: a 2-device training chain (T=40) and a U-Net-like DAG.

Device 0 ("gpu") is 3x faster with a small budget, device 1 ("cpu") slow with plenty; copies cost
per byte. Run: python tools/bench_multidevice.py [time limit seconds] [solver, default auto: HiGHS on several devices]
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Copy
from onnx_remat.passes.simulate import check_schedule, simulate
from onnx_remat.passes.solve import solve
from onnx_remat.passes.solve.baselines import keep_all
from onnx_remat.passes.solve.checkmate_milp import build_model


def chain(layers: int) -> Problem:
    """Forward f_0..f_{L-1}, then gradients g_{L-1}..g_0: g_k reads the next gradient and f_k."""
    n = 2 * layers
    edges = [(i, i + 1) for i in range(n - 1)] + [(k, n - 1 - k) for k in range(layers - 1)]
    return _problem(n, edges, [100 + 37 * (i % 5) for i in range(n)], [1 + (i % 3) for i in range(n)])


def unet(levels: int) -> Problem:
    """Encoder levels (conv, conv = skip), a bottleneck, decoder levels reading the level below and the skip."""
    edges: list[tuple[int, int]] = []
    skips: list[int] = []
    count = 0

    def op(*inputs: int | None) -> int:
        nonlocal count
        edges.extend((i, count) for i in inputs if i is not None)
        count += 1
        return count - 1

    current = None
    for _ in range(levels):
        current = op(op(current))
        skips.append(current)
    current = op(current)
    for skip in reversed(skips):
        current = op(current, skip)
    return _problem(count, edges, [100] * count, [1 + (i % 4) for i in range(count)])


def _problem(n: int, edges: list[tuple[int, int]], sizes: list[int], costs: list[int]) -> Problem:
    """One device with an unlimited budget; `two_devices` turns it into the benchmark's pair."""
    return Problem(
        op_names=tuple(f"op{i}" for i in range(n)),
        edges=tuple(sorted(set(edges))),
        output_bytes=tuple(sizes),
        cost=(tuple(float(c) for c in costs),),
        resident_bytes=(0,),
        budgets=(10**12,),
        graph_outputs=(n - 1,),
    )


def two_devices(problem: Problem, fast_budget: float, slow: float = 3.0, copy: float = 0.002) -> Problem:
    """A fast device with `fast_budget` x keep-all's peak and a `slow`-times slower one with twice keep-all."""
    keep = simulate(problem, keep_all(problem)).peak_bytes[0]
    return replace(
        problem,
        devices=("gpu", "cpu"),
        cost=(problem.cost[0], tuple(c * slow for c in problem.cost[0])),
        resident_bytes=(0, 0),
        budgets=(int(keep * fast_budget), 2 * keep),
        copy_seconds_per_byte=((0.0, copy), (copy, 0.0)),
        copy_fixed_seconds=((0.0, 0.0), (0.0, 0.0)),
    )


def main() -> None:
    time_limit = float(sys.argv[1]) if len(sys.argv) > 1 else 120.0
    solver = sys.argv[2] if len(sys.argv) > 2 else "auto"
    for name, graph in (("chain T=40", chain(20)), (f"unet T={unet(13).num_ops}", unet(13))):
        problem = two_devices(graph, 0.4)
        model = build_model(problem)
        start = time.perf_counter()
        result = solve(problem, solver, time_limit=time_limit)
        seconds = time.perf_counter() - start
        copies = sum(isinstance(e, Copy) for e in result.schedule.events)
        peaks = check_schedule(problem, result.schedule).peak_bytes
        print(
            f"{name} ({result.solver}): {len(model.milp.cost)} cols {len(model.milp.row_lower)} rows; {seconds:.1f} s "
            f"{result.status}, "
            f"cost {result.objective:.2f} (bound {result.bound:.2f}, gap {100 * result.gap:.1f}%), "
            f"{copies} copies, {result.schedule.recompute_count()} recomputes, peaks {peaks} of {problem.budgets}"
        )


if __name__ == "__main__":
    main()
