"""Choices and defaults of onnx-remat's options, in a module that imports nothing, so that the command line builds
its parsers (and answers --help) without loading onnx, a runtime or a solver. The modules that take these options
import them from here."""

from dataclasses import dataclass

MODES = ("infer", "train")
COST_MODELS = ("analytic", "profiled", "in-graph")
"""Roofline estimates; each operator timed alone on every device; or timed inside whole-model runs on each device."""
COST_MODEL_VARIABLE = "ONNX_REMAT_COST_MODEL"
"""The environment variable that replaces the default cost model (e.g. `analytic` where measuring is unwanted)."""
DEFAULT_TIME_LIMIT = 60.0
"""Seconds a command may take, start-up and writing aside."""
MINIMUM_SECONDS = 10.0
"""The most the search of the devices' minimum budgets may take when no budget is `min` (half the time limit when
that is shorter); with a `min` budget it gets half the time limit."""
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


@dataclass(frozen=True)
class TrainingOptions:
    """How to turn an inference model into a train step: loss, frozen parameters, optimizer."""

    loss: str = "mse"
    freeze: tuple[str, ...] = ()
    optimizer: str | None = None
    lr: float = 0.01
