"""Cached costs measured under load, used later: as cached against re-timed at use (passes/cost_profiled.retime).

The model is rewritten with in-graph costs measured into a fresh cache while `--busy` busy-loop processes load the
machine; the loaders are stopped, then `--rounds` rounds each predict the schedule's time from the cache as it was
written (no time left to re-time it) and re-timed now (as the summary does), and run the rewritten model as
`onnx-remat run` does. The table gives each round and the medians.

    python tools/bench_cached_costs.py                      # the README's main job: unet_small, train, 35%
    python tools/bench_cached_costs.py --model models/fixtures/resnet18_small.onnx --mode infer --budget 100%
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

import onnx_remat
from onnx_remat.core.devices import get_devices
from onnx_remat.models import FIXTURES
from onnx_remat.passes.simulate import simulate
from onnx_remat.pipeline import RematOptions, RematResult, costed_problem, prepare

BUSY_LOOP = "while True: pass"


def predicted_seconds(model: str, options: RematOptions, result: RematResult, cache: str, retimed: bool) -> float:
    """The schedule's time as the summary predicts it from the cached costs: re-timed now, or as cached (a deadline
    already passed leaves no time to re-time them)."""
    deadline = None if retimed else time.perf_counter()
    costed = costed_problem(prepare(model, options.mode), get_devices(options.devices), "in-graph", cache,
                            deadline=deadline)
    problem = replace(costed.problem, budgets=result.problem.budgets)
    seconds = simulate(problem, result.schedule).total_cost + costed.run_overhead
    keep_all = min(sum(costs) for costs in problem.cost) + costed.run_overhead
    return seconds * costed.load_ratio(seconds, keep_all)


def rewritten_under_load(model: str, budget: str, options: RematOptions, busy: int) -> RematResult:
    """The model rewritten with costs measured while `busy` busy loops run (stopped before returning)."""
    loaders = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(busy)]
    try:
        return onnx_remat.remat(model, budget, options)
    finally:
        for loader in loaders:
            loader.kill()
            loader.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(FIXTURES / "unet_small.onnx"))
    parser.add_argument("--mode", default="train", choices=("infer", "train"))
    parser.add_argument("--budget", default="35%")
    parser.add_argument("--busy", type=int, default=4, help="busy-loop processes while the costs are measured")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per round, median (default 20)")
    parser.add_argument("--time-limit", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        options = RematOptions(mode=args.mode, time_limit=args.time_limit, cost_model="in-graph", cache_dir=cache)
        result = rewritten_under_load(args.model, args.budget, options, args.busy)
        rows = []
        for _ in range(args.rounds):
            rows.append((predicted_seconds(args.model, options, result, cache, retimed=False),
                         predicted_seconds(args.model, options, result, cache, retimed=True),
                         onnx_remat.run_on_devices(result.model, repeats=args.repeats, measure_memory=False).seconds))
    table = Table(title=f"{Path(args.model).stem} {args.mode} at {args.budget}: costs cached under {args.busy} busy "
                  f"loops (summary then {result.report.predicted_seconds * 1e3:.3f} ms), used after they stopped")
    for column in ("round", "as cached ms", "re-timed ms", "measured ms", "as cached / measured",
                   "re-timed / measured"):
        table.add_column(column, justify="right")
    for k, (cached, retimed, measured) in enumerate(rows, 1):
        table.add_row(str(k), f"{cached * 1e3:.3f}", f"{retimed * 1e3:.3f}", f"{measured * 1e3:.3f}",
                      f"{cached / measured:.3f}", f"{retimed / measured:.3f}")
    medians = [statistics.median(column) for column in zip(*rows, strict=True)]
    table.add_row("median", *(f"{m * 1e3:.3f}" for m in medians),
                  f"{statistics.median(c / m for c, _, m in rows):.3f}",
                  f"{statistics.median(r / m for _, r, m in rows):.3f}")
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
