"""onnx-remat: rewrite an ONNX model so it runs within a memory budget, recomputing what it must.

    import onnx_remat
    result = onnx_remat.remat("model.onnx", budget="25%")
    result.save("model.remat.onnx")
    print(result.report.summary())

    options = onnx_remat.RematOptions(mode="train", time_limit=30)
    costed = onnx_remat.costed("model.onnx", options)   # prepared and costed once
    for budget in ("75%", "50%", "min"):                # each device's minimum budget searched once
        print(onnx_remat.rewritten(onnx_remat.solve_at(costed, budget, options)).report.summary())

The names below load on first use: importing the package loads no runtime or solver.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Budget": "onnx_remat.core.budget",
    "parse_budget": "onnx_remat.core.budget",
    "InfeasibleBudgetError": "onnx_remat.core.errors",
    "ModelError": "onnx_remat.core.errors",
    "OutputError": "onnx_remat.core.errors",
    "RematError": "onnx_remat.core.errors",
    "SolverError": "onnx_remat.core.errors",
    "UsageError": "onnx_remat.core.errors",
    "run_on_devices": "onnx_remat.execution",
    "DeviceRun": "onnx_remat.passes.run_devices",
    "RematOptions": "onnx_remat.core.options",
    "TrainingOptions": "onnx_remat.core.options",
    "CostedProblem": "onnx_remat.pipeline",
    "PreparedModel": "onnx_remat.pipeline",
    "RematResult": "onnx_remat.pipeline",
    "SolvedProblem": "onnx_remat.pipeline",
    "costed": "onnx_remat.pipeline",
    "remat": "onnx_remat.pipeline",
    "rewritten": "onnx_remat.pipeline",
    "solve_at": "onnx_remat.pipeline",
}
"""Public name -> the module that defines it."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'onnx_remat' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
