"""The end-to-end pipeline in stages, each a value the next takes: a prepared model (loaded, shapes fixed, in train
mode the train step) -> a costed problem (sizes and costs on the devices, each device's minimum budget searched once
for all budgets) -> a solved problem (at one set of budgets) -> the rewritten model with its report.

`remat` runs them all once; `sweep` and `max_batch` share the stages their points have in common."""

from __future__ import annotations

import fnmatch
import functools
import math
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir

from onnx_remat.core.budget import below_minimum, format_bytes
from onnx_remat.core.devices import BudgetSpec, Device, device_budgets, get_devices
from onnx_remat.core.errors import RematWarning, SolverError, UsageError, one_line
from onnx_remat.core.files import check_outputs, write_together
from onnx_remat.core.opmap import OpMap
from onnx_remat.core.options import COST_MODEL_VARIABLE, COST_MODELS, LAST_SECONDS, MODES, RematOptions, TrainingOptions
from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute, Copy, Schedule
from onnx_remat.passes import load
from onnx_remat.passes.autodiff import BuildTrainingStep
from onnx_remat.passes.autodiff.unroll_loops import UnrollConstantLoops
from onnx_remat.passes.build_problem import GraphProblem, build_problem
from onnx_remat.passes.cost_analytic import Roofline, node_seconds
from onnx_remat.passes.cost_load import load_ratio
from onnx_remat.passes.cost_profiled import (
    MeasureProgress,
    OutOfTime,
    ProfiledCosts,
    members,
    profile_costs,
    refuse_unallocatable,
)
from onnx_remat.passes.execute import random_feeds
from onnx_remat.passes.execution_frame import bytes_per_value
from onnx_remat.passes.expand_functions import ExpandFunctions
from onnx_remat.passes.manager import run_passes, to_proto
from onnx_remat.passes.model_files import has_external_data, model_files
from onnx_remat.passes.operator_groups import group_training_graph
from onnx_remat.passes.rewrite import count_role, rewrite
from onnx_remat.passes.run_devices import build_plan, race
from onnx_remat.passes.runtime_kept import kept_per_session, kept_per_shared_buffer
from onnx_remat.passes.shapes import ResolveShapes
from onnx_remat.passes.simulate import check_schedule
from onnx_remat.passes.sizes import TensorInfo, tensor_infos
from onnx_remat.passes.solve import SolveResult, solve
from onnx_remat.passes.solve.backend import SolveStatus
from onnx_remat.passes.solve.checkmate_milp import too_large, write_mps
from onnx_remat.passes.solve.min_budget import MinBudget
from onnx_remat.passes.workspace import workspace_bytes
from onnx_remat.problem_file import write_problem
from onnx_remat.report import MeasuredChoice, Report
from onnx_remat.report_builder import build_report
from onnx_remat.resolve import Minima, resolve_budgets, search_seconds

RACE_ROUNDS = 15
"""Rounds of running the candidate schedules in turn when picking by running."""
PROFILE_SHARE = 0.25
"""The share of the time limit left after preparing that measuring costs may take; past it the roofline serves, and
the summary says why (DenseNet-121's training step measured in-graph in 5 s of a 60 s limit)."""
MEASURE_SHARE = 0.5
"""The most of the time left after preparing that measuring costs may take where it needs more than PROFILE_SHARE:
the README's main job at 30 s beside two busy loops needs about 5 s of the 14 s left (its costs measured, +2.2%
predicted against keep-all, rather than the roofline's +3.6%)."""
FINISH_SECONDS = 0.2
"""What follows the solve takes beyond its work on an idle core: stopping the solver's workers, the process's exit."""
FINISH_SECONDS_PER_NODE = 2.5e-4
"""The rewrite, the report and serialising the model, per node of the prepared model, on an idle core: DenseNet-121's
training step (5506 nodes, 28 MB of weights) 1.0 s and 0.8 s to write, the README's U-Net's (705) 0.07 s (measured)."""
FINISH_SECONDS_PER_BYTE = 1e-8
"""Writing the model's weights, per byte, on an idle core."""
PLOT_SECONDS = 0.8
"""Drawing the schedule (`RematOptions.plot`: importing matplotlib, rendering, writing the image) on an idle core:
0.8-1.0 s for the README's U-Net (measured)."""
PLOT_SECONDS_PER_NODE = 2e-4
"""Drawing the schedule, per node of the prepared model, on an idle core."""
MEASURE_SECONDS = 1.0
"""Measuring the costs before their first deadline check (sessions, call overheads, a whole run), on an idle core."""
MEASURE_SECONDS_PER_NODE = 5e-4
"""Measuring the costs, per node of the prepared model, on an idle core: the README's U-Net's training step (705
nodes) 2.0-2.4 s in all, DenseNet-121's (5506) 3.7-4.7 s (measured at load 5 from other work)."""
MEASURE_RUNS = 8.0
"""Measuring the costs runs the whole model (a warm-up, three timed runs) before its first deadline check can stop it:
as long as this many runs of the roofline's keep-all (a run takes 1.6-5 times the roofline's time in CPU seconds:
ResNet-50's training step at batch 8, 224x224 11.2 s against 6.9 s, DenseNet-121's 0.57 against 0.14 s, measured).
Left out, measuring that step took 45 CPU s past a 14 s share."""
MIN_TIMED_SECONDS = 0.01
"""CPU seconds below which preparing is too short to tell the machine's load from (its slowdown is then 1)."""


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
    """A checked model in onnx-ir whose values carry concrete shapes and types (a train step in train mode) and its
    operator groups; the name and mode the report states, and whether the input kept its weights in a data file."""

    model: ir.Model
    groups: list[tuple[str, ...]] | None
    roles: tuple[str, ...] = ()
    name: str = "model"
    mode: str = "infer"
    external_data: bool = False
    slowdown: float = 1.0
    """How many times its CPU time preparing took (wall seconds over this thread's CPU seconds, at least 1): how much
    the machine's load slows this process now, which the time limit's split scales the later stages' work by."""

    @functools.cached_property
    def proto(self) -> onnx.ModelProto:
        """The model serialised, once, for what runs or reads it as ONNX (onnxruntime, the cost measurement, the
        rewrite); its value_info states every tensor's shape."""
        return to_proto(self.model)


def prepare(
    model: str | Path | onnx.ModelProto,
    mode: str = "infer",
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    training: TrainingOptions | None = None,
) -> PreparedModel:
    """Load and check the model, fix its input shapes, unroll the Loops of constant trip count (whose outputs' sizes
    shape resolution cannot know; in train mode those that may stop early too, under a mask), resolve every
    tensor's shape, in train mode build the train step, expand in place the ops onnxruntime would inline out of
    order (ExpandFunctions, after the build: a HardSwish differentiated whole keeps only its input for the
    backward), in train mode group the nodes into operators, and resolve the shapes of the new tensors."""
    if mode not in MODES:
        raise UsageError(f"unknown mode {mode!r}: use infer or train")
    wall, cpu = time.perf_counter(), time.thread_time()
    name = Path(model).name if isinstance(model, (str, Path)) else (model.graph.name or "model")
    original = run_passes(load.read_graph(model, dict(input_shapes or {})),
                          [UnrollConstantLoops(stopping=mode == "train"), ResolveShapes()])
    external_data = has_external_data(model)
    if mode == "infer":
        if ExpandFunctions()(original).modified:  # else every shape is resolved already
            run_passes(original, [ResolveShapes()])
        return PreparedModel(original, None, name=name, mode=mode, external_data=external_data,
                             slowdown=_slowdown(wall, cpu))
    options = training or TrainingOptions()
    build = BuildTrainingStep(options.loss, _matching(original, options.freeze), options.optimizer, options.lr)
    step = run_passes(original, [build, ExpandFunctions()])
    groups, roles = group_training_graph(step, build.backward_groups)
    run_passes(step, [ResolveShapes()])
    return PreparedModel(step, groups, roles, name=name, mode=mode, external_data=external_data,
                         slowdown=_slowdown(wall, cpu))


def _slowdown(wall: float, cpu: float) -> float:
    """Wall seconds since `wall` (perf_counter) over this thread's CPU seconds since `cpu` (thread_time), at least 1
    (and 1 for work too short to time)."""
    used = time.thread_time() - cpu
    return max(1.0, (time.perf_counter() - wall) / used) if used > MIN_TIMED_SECONDS else 1.0


def _matching(model: ir.Model, patterns: tuple[str, ...]) -> tuple[str, ...]:
    """The initializer names matching any of the glob `patterns`; a pattern matching none is an error."""
    names = list(model.graph.initializers)
    matched = []
    for pattern in patterns:
        hits = fnmatch.filter(names, pattern)
        if not hits:
            raise UsageError(f"--freeze {pattern!r} matches no parameter: names look like {names[0]!r}")
        matched.extend(hits)
    return tuple(dict.fromkeys(matched))


@dataclass(frozen=True)
class CostedProblem:
    """A prepared model's problem on its devices (budgets still 0) with its costs and the measurements behind them,
    if any; `minima` searches each device's minimum budget once for every budget solved at."""

    prepared: PreparedModel
    devices: tuple[Device, ...]
    graph: GraphProblem
    profiled: ProfiledCosts | None
    minima: Minima = field(compare=False, repr=False)
    cost_model: str = "analytic"
    cost_source: str = "roofline estimates"
    """The cost model used and where its costs come from (measured, read from the cache, or the roofline and why)."""

    @property
    def run_overhead(self) -> float:
        """Seconds a run on one device costs beyond its operators (measured with the costs; 0 otherwise)."""
        if self.profiled is None or len(self.devices) != 1:
            return 0.0
        return self.profiled.run_overhead_seconds[self.devices[0].name]

    def load_ratio(self, seconds: float, keep_all: float) -> float:
        """How much longer per second a predicted run of `seconds` waits for the CPU now than keep-all's, whose runs
        the in-graph costs were scaled to (`cost_load`, on the CPU time of both: the share of keep-all's runs spent
        on the CPU); 1 for other costs, which are not whole runs' times."""
        if self.cost_model != "in-graph" or self.profiled is None or len(self.devices) != 1:
            return 1.0
        share = self.profiled.cpu_share[self.devices[0].name]
        return load_ratio(seconds * share, keep_all * share)

    @property
    def problem(self) -> Problem:
        return self.graph.problem

    @property
    def opmap(self) -> OpMap:
        return self.graph.opmap


@dataclass(frozen=True)
class SolvedProblem:
    """A costed problem solved at one set of budgets: the problem with them, the solver's result (with the run
    measurement that picked it, if any), each device's best known minimum budget and device 0's proven lower bound
    (None where not searched)."""

    costed: CostedProblem
    problem: Problem
    result: SolveResult
    minimum_bytes: tuple[int | None, ...]
    minimum_lower_bytes: int | None
    measured_choice: MeasuredChoice | None = None

    def report(self) -> Report:
        """The report of this solution; `rewritten` adds the count of recomputed nodes in the rewritten graph."""
        costed = self.costed
        prepared, overhead = costed.prepared, costed.run_overhead
        report = build_report(prepared.name, prepared.mode, self.problem, self.minimum_bytes[0], self.result, overhead)
        ratio = costed.load_ratio(report.predicted_seconds, report.keep_all_seconds)
        return replace(report, measured_choice=self.measured_choice, minimum_lower_bytes=self.minimum_lower_bytes,
                       cost_model=costed.cost_model, cost_source=costed.cost_source, run_overhead_seconds=overhead,
                       predicted_seconds=report.predicted_seconds * ratio, load_ratio=ratio)


def remat(
    model: str | Path | onnx.ModelProto,
    budget: BudgetSpec | None = "100%",
    options: RematOptions | None = None,
    *,
    started: float | None = None,
    **changes: Any,
) -> RematResult:
    """Rewrite `model` (in train mode: its train step) so it runs within `budget` at the least predicted time.

    `budget`: one budget for every device, `name=budget,...` per device, a mapping, or None to take each
    device's from its device file. `options` (RematOptions) says how; keywords change single options of it, as
    `remat(model, "25%", mode="train", time_limit=30)`. The time limit counts from `started` (a perf_counter
    reading; default the call), preparing included."""
    options = replace(options or RematOptions(), **changes)
    started = time.perf_counter() if started is None else started
    devices = get_devices(options.devices)
    budgets = device_budgets(devices, budget)
    return rewritten(solve_at(costed(model, options, devices, started), budgets, options, started))


def costed(
    model: str | Path | onnx.ModelProto | PreparedModel, options: RematOptions | None = None,
    devices: Sequence[Device] | None = None, started: float | None = None,
) -> CostedProblem:
    """The first two stages as `options` say: `model` prepared (unless it is already), and its problem costed on
    `devices` (default the options' devices), measuring for PROFILE_SHARE of the time limit left since `started`
    (default now) at most."""
    options = options or RematOptions()
    started = time.perf_counter() if started is None else started
    devices = get_devices(options.devices) if devices is None else devices
    prepared = model if isinstance(model, PreparedModel) else prepare(
        model, options.mode, options.input_shapes, options.training)
    finish = finish_seconds(prepared, options.plot)
    roofline = costed_problem(prepared, devices)
    _warn_if_late(options.time_limit, started, finish, roofline.problem)
    left = _time_left(options.time_limit, started, finish)
    share = None if left is None else _measure_share(left, _measure_seconds(roofline))
    return _costs(roofline, options.cost_model, options.cache_dir, options.profile_progress, share)


def _measure_share(left: float, needs: float) -> float:
    """Seconds measuring the costs may take of the `left` for it, the minimum search and the solver, when it `needs`
    that long at least: PROFILE_SHARE of it, or what it needs where that is at most MEASURE_SHARE of it, else 0 (the
    roofline serves)."""
    return max(PROFILE_SHARE * left, needs if needs <= MEASURE_SHARE * left else 0.0)


def default_cost_model(device_count: int) -> str:
    """$ONNX_REMAT_COST_MODEL if set, else this machine's own: one device timed inside whole-model runs ("in-graph",
    as `onnx-remat run` executes it), several each operator alone ("profiled", with the copies between them)."""
    chosen = os.environ.get(COST_MODEL_VARIABLE) or ("profiled" if device_count > 1 else "in-graph")
    if chosen not in COST_MODELS:
        raise UsageError(f"${COST_MODEL_VARIABLE} is {chosen!r}: use {' or '.join(COST_MODELS)}")
    return chosen


def _costs(
    roofline: CostedProblem, cost_model: str | None, cache_dir: str | Path | None, progress: MeasureProgress | None,
    share: float | None,
) -> CostedProblem:
    """The `roofline` problem with `cost_model`'s costs as asked, or by default measured, the roofline's kept (saying
    why) when measuring is impossible here, or when it would not finish in its `share` of seconds (None: no limit).
    The share is judged against what measuring needs before its deadline is set: set first, the moments between made
    a share of exactly what it needs (`_measure_share`) always too short."""
    chosen = cost_model or default_cost_model(len(roofline.devices))
    if chosen == "analytic":
        return roofline
    if cost_model is not None:  # sizes it cannot allocate refuse a model asked for, whatever the time left
        model = roofline.prepared.model
        refuse_unallocatable(members(model, roofline.opmap.node_names), tensor_infos(model))
    needs = _measure_seconds(roofline)
    if share is not None and needs > share:
        return replace(roofline, cost_source=(
            f"roofline estimates: measuring {chosen} costs would take longer than its share of the time limit "
            f"(about {needs:.1f} s here); a longer time limit measures them once, for the cache"))
    deadline = None if share is None else time.perf_counter() + share
    try:
        costed = with_measured_costs(roofline, chosen, cache_dir, progress, deadline)
    except OutOfTime as exc:
        return replace(roofline, cost_source=(
            f"roofline estimates: measuring {chosen} costs would take longer than its share of the time limit "
            f"({exc}); a longer time limit measures them once, for the cache"))
    except Exception as exc:  # any runtime's failure to run the model: the roofline needs no runtime
        if cost_model is not None:
            raise
        return replace(roofline, cost_source=f"roofline estimates: measuring {chosen} costs failed ({one_line(exc)})")
    return costed


def _measured_source(profiled: ProfiledCosts, method: str) -> str:
    """Where measured costs come from: measured now, or cached (in-graph ones scaled to whole runs timed now, or
    not where no time was left for that)."""
    devices = f"{', '.join(profiled.devices)} on this machine"
    if not profiled.from_cache:
        return f"measured {devices}"
    if profiled.retimed is not None:
        scales = ", ".join(f"x{scale:.2f}" for scale in profiled.retimed.values())
        return f"read from the cache of {devices}, scaled {scales} to whole-model runs timed now"
    if method == "in-graph":
        return f"read from the cache of {devices}, as cached (no time left to re-time them)"
    return f"read from the cache of {devices}"


def costed_problem(
    prepared: PreparedModel,
    devices: Sequence[Device],
    cost_model: str = "analytic",
    cache_dir: str | Path | None = None,
    progress: MeasureProgress | None = None,
    deadline: float | None = None,
) -> CostedProblem:
    """The problem of a prepared model on `devices` (budgets still 0) with analytic (roofline) costs, or with
    costs measured on every device ("profiled" or "in-graph", cached in `cache_dir`; OutOfTime past `deadline`)."""
    if cost_model not in COST_MODELS:
        raise UsageError(f"unknown cost model {cost_model!r}: use {' or '.join(COST_MODELS)}")
    infos = tensor_infos(prepared.model)
    roofline = Roofline()
    costs = {device.name: lambda n, i: node_seconds(n, i, roofline) for device in devices}
    kept = {device.name: kept_per_shared_buffer(device) for device in devices}
    sessions = {device.name: kept_per_session(device, prepared.model.graph, infos) for device in devices}
    frames = {device.name: bytes_per_value(device) for device in devices}
    graph = build_problem(prepared.model, infos, costs, workspace_bytes, prepared.groups, prepared.roles, kept,
                          sessions, frames)
    analytic = CostedProblem(prepared, tuple(devices), graph, None, Minima(graph.problem, prepared.slowdown))
    if cost_model == "analytic":
        return analytic
    return with_measured_costs(analytic, cost_model, cache_dir, progress, deadline, infos)


def with_measured_costs(
    roofline: CostedProblem, cost_model: str, cache_dir: str | Path | None = None,
    progress: MeasureProgress | None = None, deadline: float | None = None,
    infos: dict[str, TensorInfo] | None = None,
) -> CostedProblem:
    """`roofline`'s problem (built once, whether its costs are measured or not) with costs measured on every device
    ("profiled" or "in-graph", cached in `cache_dir`; OutOfTime past `deadline`) and where they come from; `infos`:
    its model's tensor infos, if at hand."""
    prepared = roofline.prepared
    infos = tensor_infos(prepared.model) if infos is None else infos
    profiled = profile_costs(prepared.model, infos, roofline.opmap.node_names, roofline.devices, cache_dir=cache_dir,
                             progress=progress, method=cost_model, deadline=deadline)
    problem = profiled.apply(roofline.problem)
    return replace(roofline, graph=replace(roofline.graph, problem=problem), profiled=profiled,
                   minima=Minima(problem, prepared.slowdown), cost_model=cost_model,
                   cost_source=_measured_source(profiled, cost_model))


def solve_at(
    costed: CostedProblem, budget: BudgetSpec | None, options: RematOptions | None = None,
    started: float | None = None,
) -> SolvedProblem:
    """Solve `costed` at `budget` (as `remat` takes it), refusing a device's budget below its minimum; the time limit
    counts from `started` (default now), and the minimum-budget search and the solver share what is left of it."""
    options = options or RematOptions()
    started = time.perf_counter() if started is None else started
    wanted = list(device_budgets(costed.devices, budget).values())
    finish = finish_seconds(costed.prepared, options.plot)
    proof_seconds = search_seconds(_time_left(options.time_limit, started, finish), wanted,
                                   not too_large(costed.problem))
    resolved = resolve_budgets(costed.minima, wanted, options.find_minimum, proof_seconds)
    problem = replace(costed.problem, budgets=resolved.budgets)
    if options.emit_problem:
        write_problem(problem, options.emit_problem)
    if options.emit_mps:
        write_mps(problem, options.emit_mps)
    found = resolved.minima
    try:
        result = _solve_within(costed, problem, options, started, finish, found, resolved.reached)
    except SolverError as exc:
        if problem.num_devices > 1:
            raise
        known = _known_minimum(costed.minima, problem, exc, proof_seconds)  # the budget is at or above it
        found = (known,)
        result = _solve_within(costed, problem, options, started, finish, found,
                               () if known.schedule is None else (known.schedule,))
    choice = None
    if options.pick_by_running:
        result, choice = faster_by_running(costed.prepared, costed.opmap, problem, result, costed.devices)
    peaks = result.simulation.peak_bytes
    minima = tuple(None if known is None else min(known.feasible, peak)  # the schedule fits its peak
                   for known, peak in zip(found, peaks, strict=True))
    lower = None if found[0] is None else found[0].lower
    return SolvedProblem(costed, problem, result, minima, lower, choice)


def rewritten(solved: SolvedProblem) -> RematResult:
    """The last stage: the model rewritten to the solved schedule, its budgets tagged, with its report."""
    costed = solved.costed
    problem, schedule = solved.problem, solved.result.schedule
    model = rewrite(costed.prepared.model, costed.opmap, schedule, problem.devices,
                    dict(zip(problem.devices, problem.budgets, strict=True)))
    report = replace(solved.report(), recomputed_nodes=count_role(model, "recompute"))
    forward_count = costed.opmap.roles.count("forward") if costed.opmap.roles else None
    return RematResult(model, schedule, problem, report, forward_count, solved.minimum_bytes, costed.profiled,
                       costed.prepared.external_data)


def _measure_seconds(roofline: CostedProblem) -> float:
    """Seconds measuring the costs of `roofline`'s model takes at least here: what it does before it can stop at its
    deadline (sessions, call overheads, whole runs, as long as MEASURE_RUNS of the roofline's keep-all run on each
    device), slowed down as preparing it was."""
    prepared = roofline.prepared
    runs = MEASURE_RUNS * sum(sum(device) for device in roofline.problem.cost)
    return prepared.slowdown * (MEASURE_SECONDS + MEASURE_SECONDS_PER_NODE * _node_count(prepared) + runs)


def _node_count(prepared: PreparedModel) -> int:
    """The nodes of the prepared model, in subgraphs too."""
    return sum(1 for _ in prepared.model.graph.all_nodes())


def finish_seconds(prepared: PreparedModel, plot: bool = False) -> float:
    """Seconds to keep from the time limit for what follows the solve (the rewrite, the report, the files, and with
    `plot` drawing the schedule): estimated from the prepared model's nodes and weight bytes, slowed down as
    preparing it was."""
    initializers = prepared.model.graph.initializers.values()
    weights = sum(v.const_value.nbytes for v in initializers if v.const_value is not None)
    return finish_estimate(_node_count(prepared), weights, plot, prepared.slowdown)


def finish_estimate(nodes: int, weight_bytes: int, plot: bool, slowdown: float) -> float:
    """`finish_seconds` for a model of `nodes` nodes and `weight_bytes` bytes of weights."""
    work = FINISH_SECONDS + FINISH_SECONDS_PER_NODE * nodes + FINISH_SECONDS_PER_BYTE * weight_bytes
    drawing = PLOT_SECONDS + PLOT_SECONDS_PER_NODE * nodes if plot else 0.0
    return slowdown * (work + drawing)


def _warn_if_late(time_limit: float | None, started: float, finish: float, problem: Problem) -> None:
    """Warn when what has run already (the imports, preparing the model, building its `problem`) and what must follow
    the solve leave nothing of `time_limit`: the command then ends past its limit, whatever the solver does, and only a
    limit above both leaves the solver any time. A graph too large for the exact solver gets the heuristics' schedule
    at any limit: a longer one leaves time to measure costs and search the minimum, not for the solver to search."""
    spent = time.perf_counter() - started
    if time_limit is None or spent + finish <= time_limit:
        return
    least = math.ceil(spent + finish)
    if too_large(problem):
        outcome = (f"at {problem.num_ops} operators the graph is too large for the exact solver, so the schedule is "
                   f"the heuristics' at any limit; raise --time-limit above {least} s to leave time to measure costs")
    else:
        outcome = f"the schedule is the heuristics'; raise --time-limit above {least} s for the solver to search"
    warnings.warn(f"starting, loading and preparing the model took {spent:.1f} s, and writing the result needs about "
                  f"{finish:.1f} s more, past the time limit of {time_limit:g} s: {outcome}", RematWarning,
                  stacklevel=3)


def _time_left(time_limit: float | None, started: float, finish: float) -> float | None:
    """Seconds left of `time_limit` since `started`, less `finish` seconds kept for what follows the solve (at least
    0; None without a limit)."""
    if time_limit is None:
        return None
    return max(0.0, time_limit - finish - (time.perf_counter() - started))


def _solve_seconds(time_limit: float | None, started: float, finish: float) -> float | None:
    """The solver's time: what `_time_left` says, at least LAST_SECONDS so it can return its starting schedule."""
    left = _time_left(time_limit, started, finish)
    return None if left is None else max(LAST_SECONDS, left)


def with_headroom(problem: Problem, headroom: float, minima: Sequence[int | None]) -> Problem:
    """`problem` with `headroom` (a fraction) taken off every budget; refused if the headroom takes a device from
    at least its best known minimum to below it. A budget already below that minimum but above the proven lower bound
    was let through by `resolve_budgets` for the solver to try, and stays so."""
    if not 0 <= headroom < 1:
        raise UsageError(f"headroom must be a fraction in [0, 1), not {headroom}")
    budgets = tuple(budget - int(headroom * budget) for budget in problem.budgets)
    for device, (budget, minimum) in enumerate(zip(budgets, minima, strict=True)):
        if minimum is not None and budget < minimum <= problem.budgets[device]:
            raise below_minimum(problem, device, problem.budgets[device], minimum, headroom)
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
    plans = [build_plan(rewrite(prepared.model, opmap, schedule, problem.devices), devices)
             for schedule in candidates.values()]
    seconds = dict(zip(candidates, race(plans, random_feeds(prepared.proto, seed=0), RACE_ROUNDS), strict=True))
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


def _solve_within(
    costed: CostedProblem, problem: Problem, options: RematOptions, started: float, finish: float,
    found: Sequence[MinBudget | None], hints: Sequence[Schedule],
) -> SolveResult:
    """`problem` solved as `options` say, from `hints`, in what is left of the time limit since `started` less `finish`
    seconds; its headroom refused where it takes a budget below a known minimum of `found`."""
    minima = tuple(None if known is None else known.feasible for known in found)
    return solve(with_headroom(problem, options.headroom, minima), solver=options.solver,
                 time_limit=_solve_seconds(options.time_limit, started, finish), progress=options.progress,
                 hints=hints, slowdown=costed.prepared.slowdown)


def _known_minimum(minima: Minima, problem: Problem, failure: SolverError, seconds: float) -> MinBudget:
    """For one device where the solver found no schedule, its minimum budget (searched now for `seconds` if it was not)
    when the budget is at or above the smallest known to fit: the heuristics that failed at the budget may fit below
    it (the eviction heuristic is not monotone in the budget), and the solver starts again from that schedule. Else
    InfeasibleBudgetError below the proven minimum, or `failure` with the smallest budget known to fit and the proven
    least."""
    minimum = minima.minimum(problem.budgets, 0, seconds)
    if problem.budgets[0] < minimum.lower:
        raise below_minimum(problem, 0, problem.budgets[0], minimum.feasible) from None
    if problem.budgets[0] < minimum.feasible:
        raise SolverError(f"{failure} (the smallest budget known to fit is {format_bytes(minimum.feasible)}, "
                          f"{minimum.feasible} bytes; none fits in less than {format_bytes(minimum.lower)})") from None
    return minimum
