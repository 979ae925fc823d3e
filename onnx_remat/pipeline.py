"""The end-to-end pipeline: load -> sizes and costs -> problem -> solve -> simulate -> rewrite."""

from __future__ import annotations

import fnmatch
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from onnx_remat.budget import Budget, format_bytes
from onnx_remat.devices import BudgetSpec, Device, device_budgets, get_devices
from onnx_remat.errors import InfeasibleBudgetError, RematError, SolverError, UsageError, one_line
from onnx_remat.files import check_outputs, write_together
from onnx_remat.model_files import has_external_data, model_files
from onnx_remat.opmap import OpMap
from onnx_remat.options import (
    COST_MODEL_VARIABLE,
    COST_MODELS,
    DEFAULT_TIME_LIMIT,
    LAST_SECONDS,
    MINIMUM_SECONDS,
    MODES,
    TrainingOptions,
)
from onnx_remat.passes import load
from onnx_remat.passes.autodiff import build_training_graph
from onnx_remat.passes.build_problem import GraphProblem, build_problem
from onnx_remat.passes.cost_analytic import Roofline, node_seconds
from onnx_remat.passes.cost_profiled import ProfiledCosts, profile_costs
from onnx_remat.passes.cost_profiled import Progress as ProfileProgress
from onnx_remat.passes.execute import random_feeds
from onnx_remat.passes.layers import group_training_graph
from onnx_remat.passes.manager import to_proto
from onnx_remat.passes.rewrite import count_role, rewrite
from onnx_remat.passes.run_devices import build_plan, race
from onnx_remat.passes.shapes import resolve_shapes
from onnx_remat.passes.simulate import check_schedule
from onnx_remat.passes.sizes import tensor_infos
from onnx_remat.passes.solve import SolveResult, solve
from onnx_remat.passes.solve.backend import SolveStatus
from onnx_remat.passes.solve.checkmate_milp import write_mps
from onnx_remat.passes.solve.min_budget import MinBudget, minimum_budget, quick_lower_bound
from onnx_remat.passes.workspace import workspace_bytes
from onnx_remat.plan import build_report
from onnx_remat.problem import Problem
from onnx_remat.problem_file import write_problem
from onnx_remat.report import MeasuredChoice, Report
from onnx_remat.schedule import Compute, Copy, Schedule

Progress = Callable[[float, float | None, float | None], None]
RACE_ROUNDS = 15
"""Rounds of running the candidate schedules in turn when picking by running."""


@dataclass(frozen=True)
class RematResult:
    """The rewritten model, the schedule behind it, the problem it solves and the report."""

    model: onnx.ModelProto
    schedule: Schedule
    problem: Problem
    report: Report
    forward_count: int | None = None
    minimum_bytes: tuple[int | None, ...] = ()
    """Per device, the smallest feasible budget found (with the other devices at their budgets); None if not
    searched."""
    profiled: ProfiledCosts | None = None
    """The measured costs the problem uses (cost model "profiled" or "in-graph"), or None (analytic)."""
    external_data: bool = False
    """Whether the input kept its weights in a data file: the saved model then does too, beside it."""

    def save(self, path: str | Path, force: bool = False) -> None:
        """Write the rewritten model (and its data file when weights are external) atomically, all or none."""
        files = model_files(self.model, path, self.external_data)
        check_outputs(list(files), None, force)
        write_together(files)


@dataclass(frozen=True)
class PreparedModel:
    """A checked model with concrete shapes (a train step in train mode) and its operator groups."""

    model: onnx.ModelProto
    inferred: onnx.ModelProto
    groups: list[tuple[str, ...]] | None
    roles: tuple[str, ...] = ()


def prepare(
    model: str | Path | onnx.ModelProto,
    mode: str = "infer",
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    training: TrainingOptions | None = None,
) -> PreparedModel:
    """Load and check the model, fix its input shapes, and in train mode build the train step."""
    if mode not in MODES:
        raise UsageError(f"unknown mode {mode!r}: use infer or train")
    original = to_proto(load.read_graph(model, input_shapes or {}))
    if mode == "infer":
        return PreparedModel(original, resolve_shapes(original), None)
    options = training or TrainingOptions()
    graph = build_training_graph(
        resolve_shapes(original),
        loss=options.loss,
        freeze=_matching(original, options.freeze),
        optimizer=options.optimizer,
        lr=options.lr,
    )
    model, groups, roles = group_training_graph(graph.model, graph.backward_groups)
    return PreparedModel(model, resolve_shapes(model), groups, roles)


def _matching(model: onnx.ModelProto, patterns: tuple[str, ...]) -> tuple[str, ...]:
    """The initializer names matching any of the glob `patterns`; a pattern matching none is an error."""
    names = [init.name for init in model.graph.initializer]
    matched = []
    for pattern in patterns:
        hits = fnmatch.filter(names, pattern)
        if not hits:
            raise UsageError(f"--freeze {pattern!r} matches no parameter: names look like {names[0]!r}")
        matched.extend(hits)
    return tuple(dict.fromkeys(matched))


def remat(
    model: str | Path | onnx.ModelProto,
    budget: BudgetSpec | None = "100%",
    *,
    mode: str = "infer",
    training: TrainingOptions | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    solver: str = "auto",
    time_limit: float | None = DEFAULT_TIME_LIMIT,
    progress: Progress | None = None,
    devices: str | Path | Sequence[Device] | None = None,
    cost_model: str | None = None,
    cache_dir: str | Path | None = None,
    profile_progress: ProfileProgress | None = None,
    emit_problem: str | Path | None = None,
    emit_mps: str | Path | None = None,
    pick_by_running: bool = False,
    headroom: float = 0.0,
    find_minimum: bool = True,
) -> RematResult:
    """Rewrite `model` (in train mode: its train step) so it runs within `budget` at the least predicted time.

    `devices`: a preset name, a device file or Devices (default: one onnxruntime CPU device named cpu).
    `budget`: one budget for every device, `name=budget,...` per device, a mapping, or None to take each
    device's from its device file. `cost_model`: "analytic", "profiled" (each operator measured alone on every
    device, cached in `cache_dir`) or "in-graph" (measured inside whole-model runs on every device, cached); by
    default `default_cost_model`, and the roofline if measuring fails (the report says which). `emit_problem` and
    `emit_mps` write the problem (JSON) and its MILP (MPS) before solving, so they exist even if solving fails.
    `pick_by_running`: with several devices, run the solver's schedule and each device's best schedule alone on the
    devices and keep the fastest (the report gives every time); predicted costs may misjudge a runtime.
    `headroom`: the fraction of every budget the schedule leaves free, for what the runtimes allocate beyond the
    tensors (measured in multi-device runs: 1-4% over the predicted peak); the report still states the budgets.
    `find_minimum`: search each device's minimum budget for the report even when the budget does not need it
    (with one device and an explicit budget the search is otherwise skipped, and the report's minimum is None).
    """
    started = time.perf_counter()
    devices = get_devices(devices)
    budgets = device_budgets(devices, budget)
    name = Path(model).name if isinstance(model, (str, Path)) else (model.graph.name or "model")
    prepared = prepare(model, mode, input_shapes, training)
    graph, profiled, costs_used, source = _costs(prepared, devices, cost_model, cache_dir, profile_progress)
    proof_seconds = _search_seconds(time_limit, any(b.minimum for b in budgets.values()))
    problem, searched, reached = with_budgets(graph.problem, budgets, find_minimum, proof_seconds)
    minima = tuple(None if m is None else m.feasible for m in searched)
    if emit_problem:
        write_problem(problem, emit_problem)
    if emit_mps:
        write_mps(problem, emit_mps)
    try:
        result = solve(with_headroom(problem, headroom, minima), solver=solver,
                       time_limit=_time_left(time_limit, started), progress=progress, hints=reached)
    except SolverError as exc:
        if None in minima:  # not searched: say what the budget is short of
            raise _short_budget(problem, exc, proof_seconds) from None
        raise
    choice = None
    if pick_by_running:
        result, choice = faster_by_running(prepared, graph.opmap, problem, result, devices)
    peaks = result.simulation.peak_bytes
    minima = tuple(known if known is None else min(known, peak)  # the schedule fits its peak
                   for known, peak in zip(minima, peaks, strict=True))
    rewritten = rewrite(prepared.inferred, graph.opmap, result.schedule, problem.devices,
                        dict(zip(problem.devices, problem.budgets, strict=True)))
    overhead = profiled.run_overhead_seconds[problem.devices[0]] if profiled and problem.num_devices == 1 else 0.0
    report = replace(build_report(name, mode, problem, minima[0], result, overhead), measured_choice=choice,
                     cost_model=costs_used, cost_source=source, run_overhead_seconds=overhead,
                     recomputed_nodes=count_role(rewritten, "recompute"),
                     minimum_lower_bytes=None if searched[0] is None else searched[0].lower)
    forward_count = graph.opmap.roles.count("forward") if graph.opmap.roles else None
    return RematResult(rewritten, result.schedule, problem, report, forward_count, minima, profiled,
                       has_external_data(model))


def _search_seconds(time_limit: float | None, asked_for_minimum: bool) -> float:
    """Time for the minimum-budget search: half the limit when a budget is `min` (the answer the user asked for),
    else (a refusal's or the report's figure) at most MINIMUM_SECONDS of that half."""
    if time_limit is None:
        return MINIMUM_SECONDS
    return time_limit / 2 if asked_for_minimum else min(MINIMUM_SECONDS, time_limit / 2)


def _time_left(time_limit: float | None, started: float) -> float | None:
    """What is left of `time_limit` since `started` (preparing and the minimum-budget search spent the rest), at
    least LAST_SECONDS so the solver can return its starting schedule."""
    if time_limit is None:
        return None
    return max(LAST_SECONDS, time_limit - (time.perf_counter() - started))


def with_headroom(problem: Problem, headroom: float, minima: Sequence[int | None]) -> Problem:
    """`problem` with `headroom` (a fraction) taken off every budget; refused if the headroom takes a device from
    at least its best known minimum to below it. A budget already below that minimum but above the proven lower bound
    was let through by `with_budgets` for the solver to try, and stays so."""
    if not 0 <= headroom < 1:
        raise UsageError(f"headroom must be a fraction in [0, 1), not {headroom}")
    budgets = tuple(budget - int(headroom * budget) for budget in problem.budgets)
    for device, (budget, minimum) in enumerate(zip(budgets, minima, strict=True)):
        if minimum is not None and budget < minimum <= problem.budgets[device]:
            raise InfeasibleBudgetError(
                f"device {problem.devices[device]}: its budget less {100 * headroom:g}% headroom, "
                f"{format_bytes(budget)}, is below its minimum {format_bytes(minimum)}: lower the headroom or raise "
                "the budget", minimum
            )
    return replace(problem, budgets=budgets)


def faster_by_running(
    prepared: PreparedModel, opmap: OpMap, problem: Problem, result: SolveResult, devices: Sequence[Device]
) -> tuple[SolveResult, MeasuredChoice | None]:
    """`result` with the fastest, run on the devices (median of RACE_ROUNDS rounds running them all in turn), of its
    schedule and each device's best schedule alone (status "measured" when one of those is kept, with its predicted
    cost and gap); also the measured times. None with nothing to choose from (one device)."""
    candidates = {_label(problem, result.schedule): result.schedule}
    for device, schedule in enumerate(result.device_schedules):
        if schedule is not None and schedule != result.schedule:
            candidates[f"{problem.devices[device]} alone"] = schedule
    if len(candidates) < 2:
        return result, None
    plans = [build_plan(rewrite(prepared.inferred, opmap, schedule, problem.devices), devices)
             for schedule in candidates.values()]
    seconds = dict(zip(candidates, race(plans, random_feeds(prepared.model, seed=0), RACE_ROUNDS), strict=True))
    kept = min(seconds, key=lambda label: seconds[label])
    choice = MeasuredChoice(seconds, kept)
    schedule = candidates[kept]
    if schedule is result.schedule:
        return result, choice
    simulation = check_schedule(problem, schedule)
    objective = simulation.total_cost
    gap = (objective - result.bound) / objective if objective > 0 else 0.0
    return replace(result, schedule=schedule, simulation=simulation, objective=objective, gap=gap,
                   status=SolveStatus.MEASURED), choice


def _label(problem: Problem, schedule: Schedule) -> str:
    """How a measured choice names the solver's schedule: mixed, or on which device alone."""
    used = {e.device for e in schedule.events if isinstance(e, Compute)} | {
        d for e in schedule.events if isinstance(e, Copy) for d in (e.source, e.target)}
    return "solver (mixed)" if len(used) > 1 else f"solver ({problem.devices[min(used, default=0)]} alone)"


def default_cost_model(device_count: int) -> str:
    """$ONNX_REMAT_COST_MODEL if set, else this machine's own: one device timed inside whole-model runs ("in-graph",
    as `onnx-remat run` executes it), several each operator alone ("profiled", with the copies between them)."""
    chosen = os.environ.get(COST_MODEL_VARIABLE) or ("profiled" if device_count > 1 else "in-graph")
    if chosen not in COST_MODELS:
        raise UsageError(f"${COST_MODEL_VARIABLE} is {chosen!r}: use {' or '.join(COST_MODELS)}")
    return chosen


def _costs(
    prepared: PreparedModel, devices: Sequence[Device], cost_model: str | None, cache_dir: str | Path | None,
    progress: ProfileProgress | None,
) -> tuple[GraphProblem, ProfiledCosts | None, str, str]:
    """The costed problem, the measurements, the cost model used and where its costs come from: `cost_model` as
    asked, or by default measured, falling back to the roofline (saying why) when measuring is impossible here."""
    chosen = cost_model or default_cost_model(len(devices))
    try:
        graph, profiled = costed_problem(prepared, devices, chosen, cache_dir, progress)
    except Exception as exc:  # any runtime's failure to run the model: the roofline needs no runtime
        if cost_model is not None:
            raise
        graph, _ = costed_problem(prepared, devices, "analytic")
        return graph, None, "analytic", f"roofline estimates: measuring {chosen} costs failed ({one_line(exc)})"
    if profiled is None:
        return graph, None, chosen, "roofline estimates"
    where = "read from the cache of" if profiled.from_cache else "measured"
    return graph, profiled, chosen, f"{where} {', '.join(profiled.devices)} on this machine"


def costed_problem(
    prepared: PreparedModel,
    devices: Sequence[Device],
    cost_model: str = "analytic",
    cache_dir: str | Path | None = None,
    progress: ProfileProgress | None = None,
) -> tuple[GraphProblem, ProfiledCosts | None]:
    """The problem of a prepared model on `devices` (budgets still 0) with analytic (roofline) costs, or with
    costs measured on every device ("profiled", cached in `cache_dir`); also the measurements, if any."""
    if cost_model not in COST_MODELS:
        raise UsageError(f"unknown cost model {cost_model!r}: use {' or '.join(COST_MODELS)}")
    infos = tensor_infos(prepared.inferred)
    roofline = Roofline()
    costs = {device.name: lambda n, i: node_seconds(n, i, roofline) for device in devices}
    graph = build_problem(prepared.inferred, infos, costs, workspace_bytes, prepared.groups, prepared.roles)
    if cost_model == "analytic":
        return graph, None
    method = "isolated" if cost_model == "profiled" else "in-graph"
    profiled = profile_costs(prepared.inferred, graph.opmap.node_names, devices, cache_dir=cache_dir,
                             progress=progress, method=method)
    return replace(graph, problem=profiled.apply(graph.problem)), profiled


def with_budgets(problem: Problem, budgets: dict[str, Budget], find_minimum: bool = True,
                 time_limit: float = MINIMUM_SECONDS,
                 ) -> tuple[Problem, tuple[MinBudget | None, ...], tuple[Schedule, ...]]:
    """Set each device's budget, resolved against its keep-all and minimum, refusing one below its minimum;
    also return each device's minimum budget bounds (with the other devices at their budgets) and the schedules
    that reached those minima (for the solver to start from).

    Budgets of `min` are resolved in device order, each with the later `min` devices still at keep-all. With one
    device, an explicit budget and not `find_minimum`, the minimum is searched only if the budget is below a quick
    bound (to state it when refusing), and is None otherwise: the solver then proves a budget infeasible itself."""
    keep = [problem.keep_all_bytes(d) for d in range(problem.num_devices)]
    wanted = [budgets[name] for name in problem.devices]
    requested = [keep[d] if b.minimum else b.resolve(keep[d], keep[d]) for d, b in enumerate(wanted)]
    _refuse_below_resident(problem, requested)
    if not find_minimum and problem.num_devices == 1 and not wanted[0].minimum and \
            requested[0] >= quick_lower_bound(problem):
        return replace(problem, budgets=tuple(requested)), (None,), ()
    minima, reached = [], []
    for d in range(problem.num_devices):
        problem = replace(problem, budgets=tuple(requested))
        minimum = minimum_budget(problem, d, time_limit / problem.num_devices)
        if wanted[d].minimum:
            requested[d] = minimum.feasible
        elif requested[d] < minimum.lower or (requested[d] < minimum.feasible and minimum.lower == minimum.feasible):
            raise InfeasibleBudgetError(_below_minimum(problem, d, requested[d], minimum.feasible), minimum.feasible)
        minima.append(minimum)
        reached.extend([] if minimum.schedule is None else [minimum.schedule])
    return replace(problem, budgets=tuple(requested)), tuple(minima), tuple(reached)


def _short_budget(problem: Problem, failure: SolverError, proof_seconds: float) -> RematError:
    """For one device whose minimum was not searched and no schedule was found: InfeasibleBudgetError if the budget
    is below the proven minimum, else the solver's error with the smallest budget known to fit."""
    minimum = minimum_budget(problem, 0, proof_seconds)
    if problem.budgets[0] < minimum.lower:
        return InfeasibleBudgetError(_below_minimum(problem, 0, problem.budgets[0], minimum.feasible), minimum.feasible)
    return SolverError(f"{failure} (the smallest budget known to fit is {format_bytes(minimum.feasible)}, "
                       f"{minimum.feasible} bytes)")


def _refuse_below_resident(problem: Problem, requested: list[int]) -> None:
    """Refuse budgets that cannot hold what stays on a device all run, when more than one device has one
    (with one, `with_budgets` states that device's minimum)."""
    below = [d for d in range(problem.num_devices) if requested[d] < problem.resident_bytes[d]]
    if len(below) > 1:
        names = ", ".join(f"{problem.devices[d]} {format_bytes(requested[d])}" for d in below)
        raise InfeasibleBudgetError(
            f"budgets {names} are below the {format_bytes(problem.resident_bytes[below[0]])} "
            f"({problem.resident_bytes[below[0]]} bytes) each device holds for the whole run (parameters, inputs): "
            "raise them"
        )


def _below_minimum(problem: Problem, device: int, requested: int, minimum: int) -> str:
    """The message for a budget below the minimum: the minimum in bytes and in percent of keep-all."""
    keep = problem.keep_all_bytes(device)
    amount = f"{format_bytes(minimum)} ({minimum} bytes, {100 * minimum / keep:.1f}% of keep-all)"
    if problem.num_devices == 1:
        return (
            f"budget {format_bytes(requested)} is below the minimum feasible budget {amount}: "
            "raise --budget to at least that"
        )
    name = problem.devices[device]
    return (
        f"device {name}: budget {format_bytes(requested)} is below its minimum feasible budget {amount} "
        f"with the other devices at their budgets: raise --budget {name}= to at least that"
    )
