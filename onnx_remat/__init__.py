"""onnx-remat: rewrite an ONNX model so it runs within a memory budget, recomputing what it must.

    import onnx_remat
    result = onnx_remat.remat("model.onnx", budget="25%")
    result.save("model.remat.onnx")
    print(result.report.summary())
"""

from onnx_remat.budget import Budget, parse_budget
from onnx_remat.errors import (
    InfeasibleBudgetError,
    ModelError,
    OutputError,
    RematError,
    SolverError,
    UsageError,
)
from onnx_remat.execution import run_on_devices
from onnx_remat.passes.run_devices import DeviceRun
from onnx_remat.pipeline import RematResult, remat

__all__ = [
    "Budget",
    "DeviceRun",
    "InfeasibleBudgetError",
    "ModelError",
    "OutputError",
    "RematError",
    "RematResult",
    "SolverError",
    "UsageError",
    "parse_budget",
    "remat",
    "run_on_devices",
]
