"""Measure the activation peak of ONNX models in onnxruntime and compare it with the liveness prediction.

Each measurement runs in a fresh process (see onnx_remat.passes.measure); the median is shown.

    python tools/measure_memory.py model.onnx model.remat.onnx --repeats 5 --threads 1
"""

from __future__ import annotations

import argparse
from pathlib import Path

import onnx
from rich.console import Console
from rich.table import Table

from onnx_remat.passes.measure import measure_activation_peak, predicted_activation_peak

MIB = 2**20


def row(path: Path, repeats: int, threads: int) -> list[str]:
    """One table row: model, predicted and measured activation peak, relative error."""
    predicted = predicted_activation_peak(onnx.load(path), threads)
    measured = measure_activation_peak(path, repeats, threads)
    error = f"{100 * (measured / predicted - 1):+.1f}%" if predicted else "-"
    return [path.name, f"{predicted / MIB:.2f}", f"{measured / MIB:.2f}", error]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per model (the median is shown)")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    args = parser.parse_args()
    table = Table(title=f"activation peak in onnxruntime ({args.threads} thread(s), median of {args.repeats})")
    for column in ("model", "predicted MiB", "measured MiB", "error"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for path in args.models:
        table.add_row(*row(path, args.repeats, args.threads))
    Console().print(table)


if __name__ == "__main__":
    main()
