"""The largest batch size whose rematerialized model fits a memory budget.

Varies every graph input whose first dimension is symbolic, together (an input and its label share the
batch). Doubles the batch from the start until a batch does not fit, then bisects between the last batch
that fits and the first that does not. A batch fits when `remat` finds a schedule within the budget;
it does not when the budget is below that batch's minimum feasible budget, or the solver finds no
schedule within its time limit (reported as such: a longer limit may fit it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from onnx_remat.core.devices import get_devices
from onnx_remat.core.errors import InfeasibleBudgetError, ModelError, SolverError
from onnx_remat.core.options import DEFAULT_MAX_BATCH, RematOptions
from onnx_remat.passes.load import load_model
from onnx_remat.pipeline import CostedProblem, RematResult, SolvedProblem, costed, rewritten, solve_at


@dataclass(frozen=True)
class BatchTrial:
    """One batch size tried: whether it fits, and why not (minimum budget or solver) or how (peak, time)."""

    batch: int
    fits: bool
    minimum_bytes: int | None = None
    predicted_peak_bytes: int | None = None
    predicted_seconds: float | None = None
    recomputations: int | None = None
    status: str = ""


@dataclass(frozen=True)
class MaxBatch:
    """The trials in the order tried and the largest batch that fits with its result (None if none fits)."""

    trials: tuple[BatchTrial, ...]
    batch: int | None
    result: RematResult | None


def batch_inputs(model: onnx.ModelProto) -> list[str]:
    """The graph inputs whose first dimension is symbolic (the batch), in graph order."""
    initializers = {init.name for init in model.graph.initializer}
    names = []
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if value.name not in initializers and dims and not dims[0].HasField("dim_value"):
            names.append(value.name)
    return names


def shapes_for(
    model: onnx.ModelProto, varied: list[str], given: dict[str, tuple[int, ...]], batch: int
) -> dict[str, tuple[int, ...]]:
    """Input shapes at `batch`: the given shapes with their first dimension replaced, other varied inputs
    with their fixed dimensions (a symbolic one other than the first needs --input-shape)."""
    shapes = dict(given)
    for value in model.graph.input:
        if value.name not in varied:
            continue
        dims = value.type.tensor_type.shape.dim
        if value.name in given:
            shapes[value.name] = (batch, *given[value.name][1:])
            continue
        rest = list(dims[1:])
        if any(not d.HasField("dim_value") for d in rest):
            example = "x".join(["1"] + [str(d.dim_value or 1) for d in rest])
            raise ModelError(
                f"input {value.name!r} has symbolic dimensions besides the batch: fix them with "
                f"--input-shape {value.name}={example} (its first dimension is the batch to start from)"
            )
        shapes[value.name] = (batch, *(d.dim_value for d in rest))
    return shapes


def max_batch(
    model: str | Path | onnx.ModelProto,
    budget_bytes: int,
    options: RematOptions | None = None,
    *,
    limit: int = DEFAULT_MAX_BATCH,
    on_trial: Callable[[BatchTrial], None] | None = None,
) -> MaxBatch:
    """The largest batch up to `limit` that fits `budget_bytes`, by doubling then bisection.

    Each batch tried is prepared, costed and solved (its shapes differ); only the largest that fits is rewritten."""
    options = options or RematOptions()
    model = load_model(model)
    varied = batch_inputs(model)
    if not varied:
        raise ModelError(
            "no graph input has a symbolic first (batch) dimension, so there is no batch to vary: export the "
            "model with a dynamic batch axis (torch.onnx.export(..., dynamic_axes={'input': {0: 'batch'}}))"
        )
    given = dict(options.input_shapes)
    start = min((given[name][0] for name in varied if name in given), default=1)
    devices = get_devices(options.devices)
    trials: list[BatchTrial] = []
    best: SolvedProblem | None = None  # the solution of the largest batch that fits so far

    def fits(batch: int) -> bool:
        nonlocal best
        started = time.perf_counter()
        # the search asks what fits: timing the model at every batch tried would cost more than the search
        at_batch = replace(options, input_shapes=shapes_for(model, varied, given, batch), cost_model="analytic")
        trial, solved = _try(costed(model, at_batch, devices), budget_bytes, at_batch, batch, started)
        trials.append(trial)
        if solved is not None and all(batch > t.batch for t in trials[:-1] if t.fits):
            best = solved
        if on_trial is not None:
            on_trial(trial)
        return trial.fits

    low, high = 0, None
    batch = start
    while batch <= limit:
        if not fits(batch):
            high = batch
            break
        low, batch = batch, batch * 2
    if high is None:
        high = limit + 1
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return MaxBatch(tuple(trials), low or None, None if best is None else rewritten(best))


def _try(
    problem: CostedProblem, budget_bytes: int, options: RematOptions, batch: int, started: float
) -> tuple[BatchTrial, SolvedProblem | None]:
    """Solve at `batch`: the trial, and the solution if it fits."""
    try:
        solved = solve_at(problem, budget_bytes, options, started)
    except InfeasibleBudgetError as exc:
        return BatchTrial(batch, False, exc.minimum_bytes, status="below minimum"), None
    except SolverError:
        return BatchTrial(batch, False, status="no schedule in time limit"), None
    report = solved.report()
    trial = BatchTrial(
        batch,
        True,
        report.minimum_budget_bytes,
        report.predicted_peak_bytes,
        report.predicted_seconds,
        sum(r.extra_computations for r in report.recomputations),
        report.solver.status,
    )
    return trial, solved
