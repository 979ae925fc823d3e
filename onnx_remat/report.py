"""The report of a rematerialization run: what was recomputed, predicted time and memory, solver state."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from onnx_remat.budget import format_bytes


@dataclass(frozen=True)
class Recomputation:
    """An operator computed more than once: how often, the bytes its output frees, the time it adds."""

    op: str
    extra_computations: int
    output_bytes: int
    added_seconds: float


@dataclass(frozen=True)
class BaselineResult:
    """A reference schedule's predicted time and peak memory, and whether it fits the budget."""

    seconds: float
    peak_bytes: int
    within_budget: bool


@dataclass(frozen=True)
class SolverSummary:
    """How far the solver got."""

    name: str
    status: str
    objective: float
    bound: float
    gap: float
    seconds: float


@dataclass(frozen=True)
class Report:
    """Everything a user reads after a run; serialised as the `--report` JSON."""

    model: str
    mode: str
    devices: tuple[str, ...]
    num_ops: int
    budget_bytes: int
    keep_all_bytes: int
    minimum_budget_bytes: int
    resident_bytes: int
    predicted_peak_bytes: int
    predicted_seconds: float
    keep_all_seconds: float
    recomputations: tuple[Recomputation, ...]
    solver: SolverSummary
    baselines: dict[str, BaselineResult] = field(default_factory=dict)

    @property
    def time_overhead(self) -> float:
        """Predicted time relative to running every operator once (0.05 = 5% slower)."""
        return self.predicted_seconds / self.keep_all_seconds - 1 if self.keep_all_seconds else 0.0

    def to_json(self) -> str:
        data = asdict(self)
        data["time_overhead"] = self.time_overhead
        return json.dumps(data, indent=2)

    def summary(self) -> str:
        """The short human summary the CLI prints on stderr."""
        recomputed = sum(r.extra_computations for r in self.recomputations)
        s = self.solver
        lines = [
            f"model        {self.model} ({self.mode}, {self.num_ops} operators, devices: {', '.join(self.devices)})",
            f"budget       {format_bytes(self.budget_bytes)} "
            f"({100 * self.budget_bytes / self.keep_all_bytes:.1f}% of keep-all {format_bytes(self.keep_all_bytes)}; "
            f"minimum {format_bytes(self.minimum_budget_bytes)})",
            f"peak         {format_bytes(self.predicted_peak_bytes)} predicted "
            f"(resident {format_bytes(self.resident_bytes)})",
            f"time         {self.predicted_seconds * 1e3:.3f} ms predicted, "
            f"{100 * self.time_overhead:+.1f}% against keep-all {self.keep_all_seconds * 1e3:.3f} ms",
            f"recompute    {recomputed} extra computations of {len(self.recomputations)} operators",
            f"solver       {s.name}: {s.status}, gap {100 * s.gap:.2f}%, {s.seconds:.2f} s",
        ]
        return "\n".join(lines)
