"""Rewrite bundled models at several budgets and measure the results in onnxruntime.

One row per (model, mode, budget): keep-all and budget, the activation peak of the rewritten model as the
solver predicts it (its schedule, a layer's inputs and output held for the whole layer), as its graph predicts
it (node by node, as onnxruntime frees) and as measured, the un-rewritten model's measured peak, predicted
and measured time against the un-rewritten model, recomputations, solver status and time. Activation peaks
leave out parameters and inputs, which the process holds before the run. Medians of `--repeats` runs.

    python tools/bench_remat.py
    python tools/bench_remat.py --cases wavenet:infer:100%,15%,min unet_small.onnx:train:100%,50%
    python tools/bench_remat.py --cases resnet18:train:100%,50%,25%,min unet:train:100%,50%,25%   # issue 3
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import onnx
from rich.console import Console
from rich.table import Table

import onnx_remat
from onnx_remat.budget import format_bytes
from onnx_remat.models import FIXTURES, build
from onnx_remat.passes.measure import held_before_run, measure_activation_peak, predicted_activation_peak
from onnx_remat.pipeline import prepare
from onnx_remat.sweep import median_seconds

DEFAULT_CASES = (
    "wavenet:infer:100%,15%,min",
    "unet_small.onnx:infer:100%,min,10%",
    "resnet18_small.onnx:infer:100%,min,10%",
    "unet_small.onnx:train:100%,50%,min",
    "resnet18:train:100%,50%,25%,min",
    "unet:train:100%,50%,25%",
)
# The paper's batch of 8, at sizes where activations outweigh parameters and tensors are 0.5-2 MiB.
BUILDER_ARGS = {"wavenet": {"length": 8192}, "resnet18": {"batch": 8, "resolution": 128},
                "unet": {"batch": 8, "resolution": 64}}
COLUMNS = ("model", "mode", "budget", "keep-all", "solver pred.", "graph pred.", "meas. peak", "meas/solver",
           "meas/graph", "unrewritten meas.", "pred. time", "meas. time", "recomputes", "solver")


def load(name: str) -> onnx.ModelProto:
    """A fixture file name or a builder name (with the benchmark's sizes)."""
    if name.endswith(".onnx"):
        return onnx.load(str(FIXTURES / name))
    return build(name, **BUILDER_ARGS.get(name, {}))


def bench(name: str, mode: str, budget: str, workdir: Path, repeats: int) -> list[str]:
    """One row: rewrite at `budget`, measure the rewritten and the un-rewritten model."""
    model = load(name)
    stem = name.removesuffix(".onnx")
    try:
        result = onnx_remat.remat(model, budget, mode=mode)
    except onnx_remat.InfeasibleBudgetError as exc:
        return [stem, mode, budget, "", f"refused: minimum {format_bytes(exc.minimum_bytes or 0)}"] + [""] * 9
    original, rewritten = workdir / f"{stem}.{mode}.onnx", workdir / f"{stem}.{mode}.remat.onnx"
    unrewritten = prepare(model, mode).model
    onnx.save(unrewritten, str(original))
    result.save(rewritten, force=True)
    report = result.report
    predicted = report.predicted_peak_bytes - held_before_run(result.model)
    graph_predicted = predicted_activation_peak(result.model)
    measured = measure_activation_peak(rewritten, repeats=repeats)
    time_ratio = median_seconds(result.model, repeats) / median_seconds(unrewritten, repeats)
    return [
        stem, mode, f"{budget} = {format_bytes(report.budget_bytes)}", format_bytes(report.keep_all_bytes),
        format_bytes(predicted), format_bytes(graph_predicted), format_bytes(measured),
        f"{100 * (measured / predicted - 1):+.1f}%", f"{100 * (measured / graph_predicted - 1):+.1f}%",
        format_bytes(measure_activation_peak(original, repeats=repeats)),
        f"{100 * report.time_overhead:+.1f}%", f"{100 * (time_ratio - 1):+.1f}%",
        str(sum(r.extra_computations for r in report.recomputations)),
        f"{report.solver.status} {report.solver.seconds:.1f}s",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="*", default=list(DEFAULT_CASES), help="MODEL:MODE:BUDGET,BUDGET,...")
    parser.add_argument("--repeats", type=int, default=5, help="runs per measurement (the median is shown)")
    args = parser.parse_args()
    table = Table(title="onnx-remat on onnxruntime CPU (1 thread, arena and buffer reuse off); activation peaks")
    for column in COLUMNS:
        table.add_column(column)
    with tempfile.TemporaryDirectory() as workdir:
        for case in args.cases:
            name, mode, budgets = case.split(":")
            for budget in budgets.split(","):
                table.add_row(*bench(name, mode, budget, Path(workdir), args.repeats))
    Console(width=240).print(table)


if __name__ == "__main__":
    main()
