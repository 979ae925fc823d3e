"""Build the report of a solved problem: what is recomputed, what is copied, each device's time and peak.

Kept apart from the pipeline so that every caller (the main command, sweeps, the max-batch search) reports
a schedule the same way, and apart from `report` so that the report stays plain data.
"""

from __future__ import annotations

from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute, Copy, Free, Schedule
from onnx_remat.passes.simulate import Simulation, simulate
from onnx_remat.passes.solve import SolveResult
from onnx_remat.passes.solve.baselines import baselines_of
from onnx_remat.report import BaselineResult, CopyRecord, DeviceUsage, Recomputation, Report, SolverSummary


def build_report(
    name: str, mode: str, problem: Problem, minimum_bytes: int | None, result: SolveResult, run_overhead: float = 0.0
) -> Report:
    """Summarise a solved problem: memory and time per device, recomputations, copies, solver state, baselines; the
    predicted peaks are the schedule replayed as `run` holds memory (`simulate(..., as_run=True)`: at most the
    solvers'), the predicted times of whole runs include `run_overhead`, the seconds a run costs beyond its
    operators."""
    simulation = simulate(problem, result.schedule, as_run=True)
    keep_all_seconds = min(sum(costs) for costs in problem.cost) + run_overhead
    return Report(
        model=name,
        mode=mode,
        devices=problem.devices,
        num_ops=problem.num_ops,
        budget_bytes=problem.budgets[0],
        keep_all_bytes=problem.keep_all_bytes(),
        minimum_budget_bytes=minimum_bytes,
        resident_bytes=resident(problem, result.schedule, 0),
        predicted_peak_bytes=max(simulation.peak_bytes),
        predicted_seconds=simulation.total_cost + run_overhead,
        keep_all_seconds=keep_all_seconds,
        recomputations=recomputations(problem, result.schedule),
        solver=SolverSummary(result.solver, result.status, result.objective, result.bound, result.gap, result.seconds),
        baselines=baselines(problem, run_overhead),
        device_usage=device_usage(problem, result.schedule, simulation),
        copies=copies(problem, result.schedule),
        computed_once=tuple(problem.op_names[op] for op in problem.computed_once),
    )


def recomputations(problem: Problem, schedule: Schedule) -> tuple[Recomputation, ...]:
    """Each operator computed more than once: extra runs, the bytes it frees, for how many stages, the time added."""
    runs: dict[int, list[Compute]] = {}
    for compute in schedule.computes:
        runs.setdefault(compute.op, []).append(compute)
    gaps = _stages_held_nowhere(problem, schedule)
    return tuple(
        Recomputation(
            op=problem.op_names[op],
            extra_computations=len(computes) - 1,
            output_bytes=problem.output_bytes[op],
            added_seconds=sum(problem.cost[c.device][op] for c in computes[1:]),
            freed_stages=gaps[op],
        )
        for op, computes in sorted(runs.items())
        if len(computes) > 1
    )


def _stages_held_nowhere(problem: Problem, schedule: Schedule) -> list[int]:
    """Per operator, the stages it enters held on no device between its first and its last computation:
    how long freeing it (instead of keeping it) saved its bytes."""
    holders = [0] * problem.num_ops
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    absent_since: dict[int, int] = {}
    absent = [0] * problem.num_ops
    for event in schedule.events:
        if isinstance(event, Compute):
            first.setdefault(event.op, event.stage)
            last[event.op] = event.stage
        if isinstance(event, (Compute, Copy)):
            if holders[event.op] == 0 and event.op in absent_since:
                absent[event.op] += event.stage - absent_since.pop(event.op)
            holders[event.op] += 1
        elif isinstance(event, Free):
            holders[event.op] -= 1
            if holders[event.op] == 0:
                absent_since[event.op] = event.stage
    return [absent[op] if op in last and last[op] > first[op] else 0 for op in range(problem.num_ops)]


def copies(problem: Problem, schedule: Schedule) -> tuple[CopyRecord, ...]:
    """Every copy between devices in schedule order, with its bytes and predicted seconds."""
    return tuple(
        CopyRecord(
            op=problem.op_names[event.op],
            stage=event.stage,
            source=problem.devices[event.source],
            target=problem.devices[event.target],
            bytes=problem.output_bytes[event.op],
            seconds=problem.copy_seconds(event.op, event.source, event.target),
        )
        for event in schedule.events
        if isinstance(event, Copy)
    )


def resident(problem: Problem, schedule: Schedule, device: int) -> int:
    """What `device` holds for the whole run under `schedule`: its resident bytes and the loaded groups (parameters,
    inputs) its computations read."""
    return problem.resident_with(device, schedule.computed_on(device))


def device_usage(problem: Problem, schedule: Schedule, simulation: Simulation) -> tuple[DeviceUsage, ...]:
    """Per device: budget, keep-all, predicted peak (from `schedule`'s simulation), compute time, time of copies into
    it, runs."""
    compute_seconds = [0.0] * problem.num_devices
    copy_seconds = [0.0] * problem.num_devices
    runs = [0] * problem.num_devices
    seen: set[int] = set()
    reruns = [0] * problem.num_devices
    for event in schedule.events:
        if isinstance(event, Compute):
            compute_seconds[event.device] += problem.cost[event.device][event.op]
            runs[event.device] += 1
            reruns[event.device] += event.op in seen
            seen.add(event.op)
        elif isinstance(event, Copy):
            copy_seconds[event.target] += problem.copy_seconds(event.op, event.source, event.target)
    return tuple(
        DeviceUsage(
            name=name,
            budget_bytes=problem.budgets[d],
            keep_all_bytes=problem.keep_all_bytes(d),
            resident_bytes=resident(problem, schedule, d),
            peak_bytes=simulation.peak_bytes[d],
            compute_seconds=compute_seconds[d],
            copy_in_seconds=copy_seconds[d],
            computations=runs[d],
            recomputations=reruns[d],
        )
        for d, name in enumerate(problem.devices)
    )


def baselines(problem: Problem, run_overhead: float = 0.0) -> dict[str, BaselineResult]:
    """Predicted time (`run_overhead` included) and peak of every baseline run entirely on each device, and whether it
    fits every budget."""
    return {
        baseline.name: BaselineResult(
            baseline.total_cost + run_overhead, max(baseline.peak_bytes), baseline.fits(problem.budgets)
        )
        for baseline in baselines_of(problem)
    }
