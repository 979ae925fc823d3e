"""Rewrite bundled models at several budgets and measure the results in onnxruntime.

One row per (model, mode, budget): keep-all and budget, predicted and measured activation peak of the
rewritten model, the un-rewritten model's measured peak, predicted and measured time against the
un-rewritten model, recomputations, solver status and time. Medians of `--repeats` runs.

    python tools/bench_remat.py
    python tools/bench_remat.py --cases wavenet:infer:100%,15%,min unet_small.onnx:train:100%,50%
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import onnx
from rich.console import Console
from rich.table import Table

import onnx_remat
from onnx_remat.budget import format_bytes
from onnx_remat.models import FIXTURES, build
from onnx_remat.passes.execute import ort_session, random_feeds
from onnx_remat.passes.measure import measure_activation_peak
from onnx_remat.pipeline import prepare

DEFAULT_CASES = (
    "wavenet:infer:100%,15%,min",
    "unet_small.onnx:infer:100%,min,10%",
    "resnet18_small.onnx:infer:100%,min,10%",
    "unet_small.onnx:train:100%,50%,min",
    "resnet18:train:100%,min",
)
BUILDER_ARGS = {"wavenet": {"length": 8192}, "resnet18": {"batch": 8, "resolution": 64}}
COLUMNS = ("model", "mode", "budget", "keep-all", "pred. peak", "meas. peak", "meas/pred", "unrewritten meas.",
           "pred. time", "meas. time", "recomputes", "solver")


def load(name: str) -> onnx.ModelProto:
    """A fixture file name or a builder name (with the benchmark's sizes)."""
    if name.endswith(".onnx"):
        return onnx.load(str(FIXTURES / name))
    return build(name, **BUILDER_ARGS.get(name, {}))


def median_seconds(path: Path, repeats: int) -> float:
    """Median wall time of one run in the sessions the rewritten models need."""
    model = onnx.load(str(path))
    session, feeds = ort_session(model, threads=1), random_feeds(model, seed=0)
    session.run(None, feeds)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench(name: str, mode: str, budget: str, workdir: Path, repeats: int) -> list[str]:
    """One row: rewrite at `budget`, measure the rewritten and the un-rewritten model."""
    model = load(name)
    stem = name.removesuffix(".onnx")
    try:
        result = onnx_remat.remat(model, budget, mode=mode)
    except onnx_remat.InfeasibleBudgetError as exc:
        return [stem, mode, budget, "", f"refused: minimum {format_bytes(exc.minimum_bytes or 0)}"] + [""] * 7
    original, rewritten = workdir / f"{stem}.{mode}.onnx", workdir / f"{stem}.{mode}.remat.onnx"
    onnx.save(prepare(model, mode).model, str(original))
    result.save(rewritten, force=True)
    report = result.report
    predicted = report.predicted_peak_bytes - report.resident_bytes
    measured = measure_activation_peak(rewritten, repeats=repeats)
    time_ratio = median_seconds(rewritten, repeats) / median_seconds(original, repeats)
    return [
        stem, mode, f"{budget} = {format_bytes(report.budget_bytes)}", format_bytes(report.keep_all_bytes),
        format_bytes(predicted), format_bytes(measured), f"{100 * (measured / predicted - 1):+.1f}%",
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
