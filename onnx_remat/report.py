"""The report of a rematerialization run: what was recomputed, predicted time and memory, solver state."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from onnx_remat.core.budget import format_bytes

SUMMARY_ROWS = 8
"""How many recomputations and copies the summary lists; the JSON report has them all."""


@dataclass(frozen=True)
class Recomputation:
    """An operator computed more than once: how often, the bytes freeing its output saves, for how many stages
    it is held nowhere in between, and the compute time the extra runs add."""

    op: str
    extra_computations: int
    output_bytes: int
    added_seconds: float
    freed_stages: int = 0


@dataclass(frozen=True)
class CopyRecord:
    """A tensor copied between devices: which operator's output, in which stage, from where to where, bytes, cost."""

    op: str
    stage: int
    source: str
    target: str
    bytes: int
    seconds: float


@dataclass(frozen=True)
class DeviceUsage:
    """One device's share of the schedule: budget, keep-all, predicted peak, compute and copy-in time, runs."""

    name: str
    budget_bytes: int
    keep_all_bytes: int
    resident_bytes: int
    peak_bytes: int
    compute_seconds: float
    copy_in_seconds: float
    computations: int
    recomputations: int

    @property
    def seconds(self) -> float:
        """Predicted busy time of the device: its computations plus the copies it receives."""
        return self.compute_seconds + self.copy_in_seconds


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
class MeasuredChoice:
    """The solver's schedule and each device's best schedule alone, run on the devices: median seconds by name
    ("solver (mixed)", "solver (cpu alone)", "gpu alone"), and the name of the one kept, the fastest."""

    seconds: dict[str, float]
    kept: str


@dataclass(frozen=True)
class Report:
    """Everything a user reads after a run; serialised as the `--report` JSON."""

    model: str
    mode: str
    devices: tuple[str, ...]
    num_ops: int
    budget_bytes: int
    keep_all_bytes: int
    minimum_budget_bytes: int | None
    resident_bytes: int
    predicted_peak_bytes: int
    predicted_seconds: float
    keep_all_seconds: float
    recomputations: tuple[Recomputation, ...]
    solver: SolverSummary
    baselines: dict[str, BaselineResult] = field(default_factory=dict)
    device_usage: tuple[DeviceUsage, ...] = ()
    copies: tuple[CopyRecord, ...] = ()
    measured_choice: MeasuredChoice | None = None
    recomputed_nodes: int | None = None
    """Nodes of the rewritten model that are recomputations (an operator may span several nodes)."""
    minimum_lower_bytes: int | None = None
    """A budget no schedule fits under (proven): the minimum is exact when it equals `minimum_budget_bytes`."""
    cost_model: str = "analytic"
    """The cost model the times come from: analytic (roofline), profiled or in-graph (measured on this machine)."""
    cost_source: str = "roofline estimates"
    """Where the costs come from: measured now, read from the cache, or why measuring failed (roofline instead)."""
    run_overhead_seconds: float = 0.0
    """What a run costs beyond its operators (the runtime call, inputs in, outputs out), in the predicted times."""
    load_ratio: float = 1.0
    """In-graph costs: how much longer per second the schedule's run waits for the CPU now than keep-all's, whose
    runs the costs were scaled to (passes/cost_load.py); in `predicted_seconds`."""
    computed_once: tuple[str, ...] = ()
    """Operators that draw random numbers (Dropout in training mode, RandomUniformLike, ...): computed once and held
    until their last reader, since a recomputation would draw another mask."""

    @property
    def time_overhead(self) -> float:
        """Predicted time relative to running every operator once (0.05 = 5% slower)."""
        return self.predicted_seconds / self.keep_all_seconds - 1 if self.keep_all_seconds else 0.0

    def to_json(self) -> str:
        """The report as indented JSON, with the derived overhead and per-device seconds filled in."""
        data = asdict(self)
        data["time_overhead"] = self.time_overhead
        for usage, entry in zip(self.device_usage, data["device_usage"], strict=True):
            entry["seconds"] = usage.seconds
        return json.dumps(data, indent=2)

    def summary(self) -> str:
        """The short human summary the CLI prints on stderr."""
        recomputed = sum(r.extra_computations for r in self.recomputations)
        minimum = self._minimum_text()
        s = self.solver
        where = f"on {self.devices[0]} " if len(self.devices) > 1 else ""
        lines = [
            f"model        {self.model} ({self.mode}, {self.num_ops} operators, devices: {', '.join(self.devices)})",
            f"budget       {where}{format_bytes(self.budget_bytes)} "
            f"({100 * self.budget_bytes / self.keep_all_bytes:.1f}% of keep-all {format_bytes(self.keep_all_bytes)}; "
            f"minimum {minimum})",
            f"peak         {format_bytes(self.predicted_peak_bytes)} predicted{' on the fullest device' * bool(where)} "
            f"(resident {format_bytes(self.resident_bytes)})",
            f"time         {self.predicted_seconds * 1e3:.3f} ms predicted, "
            f"{100 * self.time_overhead:+.1f}% against keep-all {self.keep_all_seconds * 1e3:.3f} ms"
            f"{' (fastest single device)' if len(self.devices) > 1 else ''}",
            f"recompute    {'' if self.recomputed_nodes is None else f'{self.recomputed_nodes} nodes: '}"
            f"{recomputed} extra computations of {len(self.recomputations)} operators, "
            f"{1e3 * sum(r.added_seconds for r in self.recomputations):.3f} ms added",
            f"solver       {s.name}: {s.status}, gap {100 * s.gap:.2f}%, {s.seconds:.2f} s",
            f"costs        {self.cost_model}: {self.cost_source}"
            + (f", {self.run_overhead_seconds * 1e3:.3f} ms a run beyond the operators" if self.run_overhead_seconds
               else "")
            + (f"; time x{self.load_ratio:.2f} for the load a run that long meets now against keep-all's"
               if self.load_ratio != 1.0 else ""),
        ]
        if self.computed_once:
            once = self.computed_once
            more = f" and {len(once) - SUMMARY_ROWS} more" if len(once) > SUMMARY_ROWS else ""
            lines.append(f"random       {len(once)} operators computed once, never recomputed: "
                         f"{', '.join(once[:SUMMARY_ROWS])}{more}")
        if where:
            lines.append(
                f"copies       {len(self.copies)}, {format_bytes(sum(c.bytes for c in self.copies))}, "
                f"{1e3 * sum(c.seconds for c in self.copies):.3f} ms"
            )
        if self.measured_choice:
            m = self.measured_choice
            times = ", ".join(f"{name} {seconds * 1e3:.3f} ms" for name, seconds in m.seconds.items())
            lines.append(f"measured     {times}: kept {m.kept}")
        return "\n".join(lines + self._device_lines() + self._recompute_lines() + self._copy_lines())

    def _minimum_text(self) -> str:
        """The least budget found, and whether it is proven least or how far the proven bound is below it."""
        found, lower = self.minimum_budget_bytes, self.minimum_lower_bytes
        if found is None:
            return "not searched"
        if lower is None:
            return format_bytes(found)
        if lower >= found:
            return f"{format_bytes(found)}, proven"
        return f"{format_bytes(found)} found, proven at least {format_bytes(lower)}"

    def _device_lines(self) -> list[str]:
        """One line per device: predicted time and peak against its budget."""
        return [
            f"device {d.name:<6} peak {format_bytes(d.peak_bytes)} / budget {format_bytes(d.budget_bytes)}, "
            f"{d.seconds * 1e3:.3f} ms, {d.computations} runs ({d.recomputations} recomputed)"
            + (f", copies in {d.copy_in_seconds * 1e3:.3f} ms" if d.copy_in_seconds else "")
            for d in self.device_usage
        ]

    def _recompute_lines(self) -> list[str]:
        """The costliest recomputations: bytes saved while freed, for how many stages, compute added."""
        if not self.recomputations:
            return []
        rows = sorted(self.recomputations, key=lambda r: r.added_seconds, reverse=True)
        lines = ["recomputed   operator: +runs, bytes freed x stages freed, compute added"]
        lines += [
            f"  {r.op}: +{r.extra_computations}, {format_bytes(r.output_bytes)} x {r.freed_stages} stages, "
            f"+{r.added_seconds * 1e3:.3f} ms"
            for r in rows[:SUMMARY_ROWS]
        ]
        if len(rows) > SUMMARY_ROWS:
            lines.append(f"  ... and {len(rows) - SUMMARY_ROWS} more (all in --report)")
        return lines

    def _copy_lines(self) -> list[str]:
        """The copies in schedule order: tensor, direction, bytes and cost."""
        if not self.copies:
            return []
        lines = ["copied       operator output: source -> target at stage, bytes, cost"]
        lines += [
            f"  {c.op}: {c.source} -> {c.target} at {c.stage}, {format_bytes(c.bytes)}, {c.seconds * 1e3:.3f} ms"
            for c in self.copies[:SUMMARY_ROWS]
        ]
        if len(self.copies) > SUMMARY_ROWS:
            lines.append(f"  ... and {len(self.copies) - SUMMARY_ROWS} more (all in --report)")
        return lines
