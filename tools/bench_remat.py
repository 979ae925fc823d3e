"""Rewrite bundled models at several budgets and measure the result in onnxruntime.

Prints one row per (model, budget): predicted and measured activation peak of the original and
the rewritten model, predicted time overhead, recomputations, solver status and time.

    python tools/bench_remat.py                       # the bundled U-Net and ResNet18 fixtures
    python tools/bench_remat.py path/to/model.onnx --budgets 100%,60%,40%,min
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

import onnx_remat
import onnx_remat.models
from onnx_remat.budget import format_bytes
from onnx_remat.passes.measure import measure_activation_peak

FIXTURES = Path(onnx_remat.models.__file__).parent / "fixtures"
DEFAULT_MODELS = ("unet_small.onnx", "resnet18_small.onnx")


def bench(model: Path, budget: str, workdir: Path, repeats: int) -> list[str]:
    """One table row: rewrite `model` at `budget`, measure original and rewritten peaks."""
    try:
        result = onnx_remat.remat(model, budget)
    except onnx_remat.InfeasibleBudgetError as exc:
        return [model.stem, budget, "refused", f"min {format_bytes(exc.minimum_bytes or 0)}"] + [""] * 7
    out = workdir / f"{model.stem}.{budget.replace('%', 'pct')}.onnx"
    result.save(out, force=True)
    report = result.report
    predicted = report.predicted_peak_bytes - report.resident_bytes
    measured = measure_activation_peak(out, repeats=repeats)
    original = measure_activation_peak(model, repeats=repeats)
    return [
        model.stem,
        budget,
        format_bytes(report.budget_bytes),
        format_bytes(report.keep_all_bytes),
        format_bytes(predicted),
        format_bytes(measured),
        f"{100 * (measured / predicted - 1):+.1f}%",
        format_bytes(original),
        f"{100 * report.time_overhead:+.1f}%",
        f"{sum(r.extra_computations for r in report.recomputations)}",
        f"{report.solver.status} {report.solver.seconds:.1f}s",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", type=Path, default=[FIXTURES / m for m in DEFAULT_MODELS])
    parser.add_argument("--budgets", default="100%,60%,40%,min,1KiB")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per model (the median is shown)")
    args = parser.parse_args()
    table = Table(title="onnx-remat: predicted vs measured activation peak (onnxruntime CPU, arena off)")
    for column in ("model", "budget", "bytes", "keep-all", "pred. act. peak", "meas. act. peak", "meas/pred",
                   "original meas.", "time overhead", "recomputes", "solver"):
        table.add_column(column)
    with tempfile.TemporaryDirectory() as workdir:
        for model in args.models:
            for budget in args.budgets.split(","):
                table.add_row(*bench(model, budget, Path(workdir), args.repeats))
    Console().print(table)


if __name__ == "__main__":
    main()
