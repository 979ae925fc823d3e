"""Solve one model at several budgets and find the knee of its time/memory curve.

The knee is the smallest feasible budget whose predicted time is within `knee_overhead` (default 5%) of
keep-all: below it every saved byte costs noticeably more recomputation. It is a threshold, not a
curvature estimate, so that it means the same thing on a four-point sweep and a forty-point one.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from onnx_remat.core.budget import Budget, parse_budget
from onnx_remat.core.devices import Device, get_devices
from onnx_remat.core.errors import InfeasibleBudgetError, UsageError
from onnx_remat.core.options import DEFAULT_BUDGETS, DEFAULT_KNEE_OVERHEAD, RematOptions
from onnx_remat.execution import run_on_devices
from onnx_remat.passes.measure import measure_activation_peak
from onnx_remat.passes.solve.backend import SolveStatus
from onnx_remat.pipeline import RematResult, costed, rewritten, solve_at


@dataclass(frozen=True)
class SweepPoint:
    """One budget of a sweep: what was asked, what the solver predicted, what was measured (if asked).

    Infeasible budgets have status "infeasible", their requested bytes (if known) and the minimum feasible
    budget; their time and peak fields are None. Measured: the time of the execution `onnx-remat run` times (each
    device's segments on its runtime, `run_on_devices`); on one device the activation peak of the rewritten model in
    onnxruntime, on several each device's measured peak (`measured_device_peak_bytes`).
    """

    label: str
    budget_bytes: int | None
    status: str
    minimum_bytes: int | None
    keep_all_bytes: int | None = None
    predicted_seconds: float | None = None
    keep_all_seconds: float | None = None
    recomputations: int | None = None
    predicted_peak_bytes: int | None = None
    resident_bytes: int | None = None
    gap: float | None = None
    measured_activation_bytes: int | None = None
    measured_seconds: float | None = None
    device_peak_bytes: tuple[tuple[str, int], ...] = ()
    copies: int | None = None
    measured_device_peak_bytes: tuple[tuple[str, int], ...] = ()

    @property
    def feasible(self) -> bool:
        return self.status != SolveStatus.INFEASIBLE

    @property
    def overhead(self) -> float | None:
        """Predicted time relative to keep-all (0.05 = 5% slower), None if infeasible."""
        if self.predicted_seconds is None or not self.keep_all_seconds:
            return None
        return self.predicted_seconds / self.keep_all_seconds - 1


@dataclass(frozen=True)
class Sweep:
    """All points of a sweep, the knee (index into points, or None) and the overhead defining it."""

    model: str
    mode: str
    points: tuple[SweepPoint, ...]
    knee: int | None
    knee_overhead: float
    cost_model: str = "analytic"
    cost_source: str = "roofline estimates"


def parse_budgets(text: str) -> list[tuple[str, Budget]]:
    """Parse a comma-separated list of budgets (each as --budget takes it)."""
    labels = [part.strip() for part in text.split(",") if part.strip()]
    if not labels:
        raise UsageError(f"--budgets {text!r} lists no budget: write e.g. {DEFAULT_BUDGETS}")
    return [(label, parse_budget(label)) for label in labels]


def sweep(
    model: str | Path | onnx.ModelProto,
    budgets: list[tuple[str, Budget]],
    options: RematOptions | None = None,
    *,
    measure: bool = False,
    repeats: int = 3,
    knee_overhead: float = DEFAULT_KNEE_OVERHEAD,
) -> Sweep:
    """Solve `model` at every budget (infeasible ones recorded with the minimum), measuring if asked.

    The model is prepared and costed once, and each device's minimum budget searched once for all budgets it does
    not depend on (all of them with one device); the time limit holds for each budget, so measuring the costs once
    for all of them may take its share of the whole sweep's. With several devices every budget applies to each
    device, as a percentage of that device's keep-all."""
    options = options or RematOptions()
    whole = None if options.time_limit is None else options.time_limit * len(budgets)
    problem = costed(model, replace(options, time_limit=whole), get_devices(options.devices))
    keep_all = problem.problem.keep_all_bytes()
    points = []
    for label, budget in budgets:
        try:
            solved = solve_at(problem, budget, options)
        except InfeasibleBudgetError as exc:
            minimum = exc.minimum_bytes
            requested = budget.resolve(keep_all, minimum or 0)
            points.append(SweepPoint(label, requested, SolveStatus.INFEASIBLE, minimum, keep_all_bytes=keep_all))
            continue
        points.append(_point(label, rewritten(solved), measure, repeats, options.devices))
    ordered = tuple(sorted(points, key=lambda p: -(p.budget_bytes or 0)))
    return Sweep(problem.prepared.name, options.mode, ordered, find_knee(ordered, knee_overhead), knee_overhead,
                 problem.cost_model, problem.cost_source)


def _point(
    label: str, result: RematResult, measure: bool, repeats: int, devices: str | Path | Sequence[Device] | None
) -> SweepPoint:
    """A feasible point from a remat result, measured if `measure`: the execution's time (`run_on_devices`), and on
    one device the activation peak in onnxruntime, on several each device's peak."""
    report = result.report
    measured_bytes = measured_seconds = None
    device_peaks: tuple[tuple[str, int], ...] = ()
    if measure and len(result.problem.devices) > 1:
        run = run_on_devices(result.model, devices, repeats=repeats, measure_memory=True)
        measured_seconds = run.seconds
        device_peaks = tuple((run.measured_peak_bytes or {}).items())
    elif measure:
        with tempfile.TemporaryDirectory() as workdir:
            path = Path(workdir) / "model.onnx"
            onnx.save(result.model, str(path))
            measured_bytes = measure_activation_peak(path, repeats=repeats)
        # timed as `onnx-remat run` times it, which the default cost model predicts
        measured_seconds = run_on_devices(result.model, devices, repeats=repeats, measure_memory=False).seconds
    return SweepPoint(
        label=label,
        budget_bytes=report.budget_bytes,
        status=report.solver.status,
        minimum_bytes=report.minimum_budget_bytes,
        keep_all_bytes=report.keep_all_bytes,
        predicted_seconds=report.predicted_seconds,
        keep_all_seconds=report.keep_all_seconds,
        recomputations=sum(r.extra_computations for r in report.recomputations),
        predicted_peak_bytes=report.predicted_peak_bytes,
        resident_bytes=report.resident_bytes,
        gap=report.solver.gap,
        measured_activation_bytes=measured_bytes,
        measured_seconds=measured_seconds,
        device_peak_bytes=tuple((d.name, d.peak_bytes) for d in report.device_usage),
        copies=len(report.copies),
        measured_device_peak_bytes=device_peaks,
    )


def find_knee(points: tuple[SweepPoint, ...], knee_overhead: float) -> int | None:
    """Index of the smallest feasible budget whose predicted overhead is at most `knee_overhead`, or None."""
    within = [i for i, p in enumerate(points) if p.feasible and p.overhead is not None and p.overhead <= knee_overhead]
    return min(within, key=lambda i: points[i].budget_bytes or 0, default=None)
