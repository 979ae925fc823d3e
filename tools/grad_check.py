"""Print how close the training graph's gradients are to PyTorch's, and OpenVINO's to onnxruntime's.

For every bundled network (small sizes) and exported fixture, in the configurations of
tests/test_gradients_models.py: the largest relative error over the loss and every gradient, onnxruntime
float32 vs the torch oracle (float64 autograd); the same for the float64 graph in the ONNX reference runtime
where float32 is ill-conditioned; and OpenVINO vs onnxruntime on the float32 graph (for a float64 case that
float32 graph is the ill-conditioned one, so its OpenVINO cell shows float32 round-off amplified, not a check).

    python tools/grad_check.py
"""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_gradients_models import CASES, TOLERANCE, has_dropout, openvino_errors, run_case, torch_errors  # noqa: E402


def cell(errors: dict[str, float] | None) -> str:
    """The worst error (red above the tolerance) and the tensor it is in."""
    if errors is None:
        return "-"
    worst = max(errors, key=errors.get)
    color = "green" if errors[worst] <= TOLERANCE else "red"
    return f"[{color}]{errors[worst]:.1e}[/{color}] {worst}"


def row(name: str) -> list[str]:
    """One case's cells."""
    float64 = torch_errors(name, True) if CASES[name].float64 else None
    openvino = None if has_dropout(name) else openvino_errors(name)
    run = run_case(name, False)
    sizes = {init.name: math.prod(init.dims) for init in run.model.graph.initializer}
    elements = sum(sizes[p] for p in run.graph.parameters)
    params = f"{len(run.graph.parameters)} ({elements / 1e3:,.1f}k)"
    return [name, params, CASES[name].loss, cell(torch_errors(name, False)), cell(float64), cell(openvino)]


def main() -> None:
    """Check every case and print the table."""
    table = Table(title=f"Training-graph gradients (relative error; tolerance {TOLERANCE:.0e})")
    for column in ("model", "params (elements)", "loss", "onnxruntime f32 vs PyTorch", "reference f64 vs PyTorch",
                   "OpenVINO vs onnxruntime"):
        table.add_column(column, justify="right" if column.startswith("params") else "left")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in CASES:
            table.add_row(*row(name))
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
