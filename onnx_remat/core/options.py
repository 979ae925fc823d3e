"""Choices and defaults of onnx-remat's options, in a module that imports nothing, so that the command line builds
its parsers (and answers --help) without loading onnx, a runtime or a solver. The modules that take these options
import them from here."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onnx_remat.core.devices import Device

MODES = ("infer", "train")
COST_MODELS = ("analytic", "profiled", "in-graph")
"""Roofline estimates; each operator timed alone on every device; or timed inside whole-model runs on each device."""
COST_MODEL_VARIABLE = "ONNX_REMAT_COST_MODEL"
"""The environment variable that replaces the default cost model (e.g. `analytic` where measuring is unwanted)."""
DEFAULT_TIME_LIMIT = 60.0
"""Seconds a command may take, start-up and writing aside."""
DEFAULT_POINT_TIME_LIMIT = 30.0
"""Seconds each point of `sweep` (a budget) or `max-batch` (a batch size tried) may take."""
MINIMUM_SECONDS = 10.0
"""The most the search of the devices' minimum budgets may take when no budget is `min` (half the time left when that
is shorter); with a `min` budget it gets half the time left, or more where the solver has no MILP to run
(onnx_remat.resolve.search_seconds)."""
LAST_SECONDS = 0.1
"""The least time a solve is given, however much of the limit preparing took: enough to return its start."""
LOSSES = ("mse", "cross-entropy", "sum")
"""The losses the training graph can end in (onnx_remat.passes.autodiff.loss)."""
SOLVERS = ("auto", "highs", "cbc", "cpsat")
"""What `solver` may name: a backend of onnx_remat.passes.solve.BACKENDS, or "auto" to let `choose_backend` pick one."""
DEFAULT_BUDGETS = "100%,75%,50%,25%"
"""The budgets a sweep solves at (onnx_remat.sweep)."""
DEFAULT_KNEE_OVERHEAD = 0.05
"""Predicted overhead over keep-all that defines a sweep's knee."""
DEFAULT_MAX_BATCH = 4096
"""The largest batch the max-batch search tries (onnx_remat.batch)."""
DEFAULT_REPEATS = 10
"""Timed runs of a model on its devices, after a warm-up (onnx_remat.execution)."""
DEFAULT_MEMORY_PROCESSES = 3
"""Fresh processes measuring a run's peaks when the first lands near a budget or over it (onnx_remat.passes.verdict)."""


@dataclass(frozen=True)
class TrainingOptions:
    """How to turn an inference model into a train step: loss, frozen parameters, optimizer."""

    loss: str = "mse"
    freeze: tuple[str, ...] = ()
    optimizer: str | None = None
    lr: float = 0.01


@dataclass(frozen=True)
class RematOptions:
    """How `remat`, `sweep` and `max_batch` prepare, cost and solve a model: every option but the model and budget.

    `devices`: a preset name, a device file or Devices (default: one onnxruntime CPU device named cpu).
    `cost_model`: "analytic", "profiled" (each operator measured alone on every device, cached in `cache_dir`) or
    "in-graph" (measured inside whole-model runs on every device, cached); by default profiled with several devices,
    in-graph with one. `emit_problem` and `emit_mps` write the problem (JSON) and its MILP (MPS) before solving, so
    they exist even if solving fails. `pick_by_running`: with several devices, run the solver's schedule and each
    device's best schedule alone on the devices and keep the fastest (the report gives every time); predicted costs
    may misjudge a runtime. `headroom`: the fraction of every budget the schedule leaves free, for what the runtimes
    allocate beyond the tensors (measured in multi-device runs: 1-4% over the predicted peak); the report still
    states the budgets. `find_minimum`: search each device's minimum budget for the report even when the budget does
    not need it (with one device and an explicit budget the search is otherwise skipped, and the report's minimum is
    None). `plot`: the caller draws the schedule after (the command's --plot): the time limit keeps room for it.
    `progress` sees the solver's incumbent and bound, `profile_progress` the cost measurements.
    """

    mode: str = "infer"
    training: TrainingOptions = field(default_factory=TrainingOptions)
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    solver: str = "auto"
    time_limit: float | None = DEFAULT_TIME_LIMIT
    devices: str | Path | Sequence[Device] | None = None
    cost_model: str | None = None
    cache_dir: str | Path | None = None
    headroom: float = 0.0
    find_minimum: bool = True
    pick_by_running: bool = False
    plot: bool = False
    emit_problem: str | Path | None = None
    emit_mps: str | Path | None = None
    progress: Callable[[float, float | None, float | None], None] | None = None
    profile_progress: Callable[[int, int, str], None] | None = None
