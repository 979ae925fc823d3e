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
from onnx_remat.pipeline import RematResult, remat

__all__ = [
    "Budget",
    "InfeasibleBudgetError",
    "ModelError",
    "OutputError",
    "RematError",
    "RematResult",
    "SolverError",
    "UsageError",
    "parse_budget",
    "remat",
]
