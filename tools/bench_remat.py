"""Rewrite bundled models at several budgets and measure the results in onnxruntime.

One row per (model, mode, budget): the trainable parameters (elements), the budget and keep-all, the activation
peak of the rewritten model as the solver predicts it (its schedule, a layer's inputs and output held for the
whole layer), as its graph predicts it (node by node, as onnxruntime frees) and as measured, measured over
solver-predicted, the un-rewritten (keep-all) model's measured peak, predicted and measured time against the
un-rewritten model, the largest difference of any output (loss, gradients, updates) between the rewritten and
the un-rewritten model on the same feeds, recomputations, solver status and time. Activation peaks leave out
parameters and inputs, which the process holds before the run. Peaks are medians over `--repeats` fresh
processes; the measured time overhead is the median, over `--time-repeats` rounds that each run the rewritten and
then the un-rewritten model once, of their time ratio, so that load from other processes hits both alike. A
budget the solver cannot meet gives a row with the reason and the smallest feasible budget found; `min` uses it.

    python tools/bench_remat.py
    python tools/bench_remat.py --cases wavenet:infer:100%,15%,min unet_small.onnx:train:100%,50%
    python tools/bench_remat.py --cases resnet18:train:100%,50%,25%,min unet:train:100%,50%,25%,min   # issue 3
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from rich.console import Console
from rich.table import Table

import onnx_remat
from onnx_remat.core.budget import format_bytes
from onnx_remat.core.errors import InfeasibleBudgetError, SolverError
from onnx_remat.models import FIXTURES, build
from onnx_remat.passes.execute import ort_session, random_feeds
from onnx_remat.passes.measure import held_before_run, measure_activation_peak, predicted_activation_peak
from onnx_remat.pipeline import prepare

DEFAULT_CASES = (
    "wavenet:infer:100%,15%,min",
    "unet_small.onnx:infer:100%,min,10%",
    "resnet18_small.onnx:infer:100%,min,10%",
    "unet_small.onnx:train:100%,50%,min",
    "resnet18:train:100%,50%,25%,min",
    "unet:train:100%,50%,25%,min",
)
# The paper's batch of 8, at sizes where activations outweigh parameters: ResNet18 at the paper's 224x224 (at a
# quarter of its width; at 128x128 a MaxPool gradient's step, parameters and gradients alone take 27% of keep-all).
BUILDER_ARGS = {"wavenet": {"length": 8192}, "resnet18": {"batch": 8, "resolution": 224},
                "unet": {"batch": 8, "resolution": 64}}
COLUMNS = ("model", "mode", "params", "budget", "keep-all", "solver pred.", "graph pred.", "meas. peak",
           "meas/solver", "meas/graph", "keep-all meas.", "pred. time", "meas. time", "max |diff|", "recomputes",
           "solver")


def load(name: str) -> onnx.ModelProto:
    """A fixture file name or a builder name (with the benchmark's sizes)."""
    if name.endswith(".onnx"):
        return onnx.load(str(FIXTURES / name))
    return build(name, **BUILDER_ARGS.get(name, {}))


def parameter_count(model: onnx.ModelProto) -> str:
    """Elements of the model's float initializers, e.g. 11.2M."""
    count = sum(math.prod(init.dims) for init in model.graph.initializer if init.data_type == onnx.TensorProto.FLOAT)
    return f"{count / 1e6:.2f}M" if count >= 1e5 else f"{count / 1e3:.1f}k"


def interleaved_seconds(models: list[onnx.ModelProto], repeats: int) -> list[list[float]]:
    """Wall times of `repeats` onnxruntime runs (1 thread, file order) of each model, the models run in turn."""
    sessions = [ort_session(model, threads=1) for model in models]
    feeds = random_feeds(models[0], seed=0)
    for session in sessions:
        session.run(None, feeds)
    times: list[list[float]] = [[] for _ in models]
    for _ in range(repeats):
        for session, samples in zip(sessions, times, strict=True):
            start = time.perf_counter()
            session.run(None, feeds)
            samples.append(time.perf_counter() - start)
    return times


def time_overhead(model: onnx.ModelProto, baseline: onnx.ModelProto, repeats: int) -> float:
    """Median over rounds of (model's time / baseline's time) - 1, the two run back to back in each round: a burst
    of load from other processes then skews one round, not the median."""
    times, baseline_times = interleaved_seconds([model, baseline], repeats)
    return statistics.median(t / b for t, b in zip(times, baseline_times, strict=True)) - 1


def largest_difference(rewritten: onnx.ModelProto, unrewritten: onnx.ModelProto) -> float:
    """The largest |rewritten - un-rewritten| over every output, relative to that output's largest magnitude."""
    feeds = random_feeds(unrewritten, seed=1)
    names = [o.name for o in unrewritten.graph.output]
    got = dict(zip([o.name for o in rewritten.graph.output], ort_session(rewritten).run(None, feeds), strict=True))
    want = ort_session(unrewritten).run(None, feeds)
    return max(float(np.max(np.abs(got[n] - w)) / max(float(np.max(np.abs(w))), 1e-30)) if w.size else 0.0
               for n, w in zip(names, want, strict=True))


def bench(name: str, mode: str, budget: str, workdir: Path, repeats: int, time_repeats: int,
          time_limit: float) -> list[str]:
    """One row: rewrite at `budget`, measure the rewritten and the un-rewritten model."""
    model = load(name)
    stem, params = name.removesuffix(".onnx"), parameter_count(model)
    try:
        result = onnx_remat.remat(model, budget, mode=mode, time_limit=time_limit)
    except (InfeasibleBudgetError, SolverError) as exc:
        reason = "below the minimum" if isinstance(exc, InfeasibleBudgetError) else "no schedule in time limit"
        minimum = getattr(exc, "minimum_bytes", None) or _minimum(model, mode, time_limit)
        return [stem, mode, params, budget, "", f"{reason}: minimum {format_bytes(minimum)}"] + [""] * 10
    original, rewritten = workdir / f"{stem}.{mode}.onnx", workdir / f"{stem}.{mode}.remat.onnx"
    unrewritten = prepare(model, mode).proto
    onnx.save(unrewritten, str(original))
    result.save(rewritten, force=True)
    report = result.report
    predicted = report.predicted_peak_bytes - held_before_run(result.model)
    graph_predicted = predicted_activation_peak(result.model)
    measured = measure_activation_peak(rewritten, repeats=repeats)
    overhead = time_overhead(result.model, unrewritten, time_repeats)
    return [
        stem, mode, params, f"{budget} = {format_bytes(report.budget_bytes)}", format_bytes(report.keep_all_bytes),
        format_bytes(predicted), format_bytes(graph_predicted), format_bytes(measured),
        f"{100 * (measured / predicted - 1):+.1f}%", f"{100 * (measured / graph_predicted - 1):+.1f}%",
        format_bytes(measure_activation_peak(original, repeats=repeats)),
        f"{100 * report.time_overhead:+.1f}%", f"{100 * overhead:+.1f}%",
        f"{largest_difference(result.model, unrewritten):.0e}",
        str(sum(r.extra_computations for r in report.recomputations)),
        f"{report.solver.status} {report.solver.seconds:.1f}s",
    ]


def _minimum(model: onnx.ModelProto, mode: str, time_limit: float) -> int:
    """The smallest feasible budget the pipeline finds (what `--budget min` resolves to)."""
    return onnx_remat.remat(model, "min", mode=mode, time_limit=time_limit).report.budget_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="*", default=list(DEFAULT_CASES), help="MODEL:MODE:BUDGET,BUDGET,...")
    parser.add_argument("--repeats", type=int, default=5, help="runs per measurement (the median is shown)")
    parser.add_argument("--time-repeats", type=int, default=31, help="timed rounds (median ratio)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="solver seconds per budget")
    args = parser.parse_args()
    table = Table(title="onnx-remat on onnxruntime CPU (1 thread, arena and buffer reuse off); activation peaks")
    for column in COLUMNS:
        table.add_column(column)
    with tempfile.TemporaryDirectory() as workdir:
        for case in args.cases:
            name, mode, budgets = case.split(":")
            for budget in budgets.split(","):
                row = bench(name, mode, budget, Path(workdir), args.repeats, args.time_repeats,
                            args.time_limit)
                print(" | ".join(row), file=sys.stderr, flush=True)
                table.add_row(*row)
    Console(width=260).print(table)


if __name__ == "__main__":
    main()
