"""The end-to-end pipeline: load -> sizes and costs -> problem -> solve -> simulate -> rewrite."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from onnx_remat.budget import Budget, format_bytes, parse_budget
from onnx_remat.errors import InfeasibleBudgetError, OutputError, UsageError
from onnx_remat.files import write_atomically
from onnx_remat.passes import load
from onnx_remat.passes.autodiff import build_training_graph
from onnx_remat.passes.build_problem import build_problem
from onnx_remat.passes.cost_analytic import Roofline, node_seconds
from onnx_remat.passes.layers import group_roles, separate_graph_outputs, training_groups
from onnx_remat.passes.rewrite import rewrite
from onnx_remat.passes.simulate import check_schedule, simulate
from onnx_remat.passes.sizes import tensor_infos
from onnx_remat.passes.solve import SolveResult, solve
from onnx_remat.passes.solve.baselines import chen_sqrt_n, keep_all
from onnx_remat.passes.solve.min_budget import minimum_budget
from onnx_remat.passes.workspace import workspace_bytes
from onnx_remat.problem import Problem
from onnx_remat.report import BaselineResult, Recomputation, Report, SolverSummary
from onnx_remat.schedule import Schedule

Progress = Callable[[float, float | None, float | None], None]
MODES = ("infer", "train")
DEFAULT_TIME_LIMIT = 60.0


@dataclass(frozen=True)
class RematResult:
    """The rewritten model, the schedule behind it, the problem it solves and the report."""

    model: onnx.ModelProto
    schedule: Schedule
    problem: Problem
    report: Report
    forward_count: int | None = None

    def save(self, path: str | Path, force: bool = False) -> None:
        """Write the rewritten model atomically (temporary file, then rename)."""
        check_output_path(path, None, force)
        write_atomically(Path(path), self.model.SerializeToString())


@dataclass(frozen=True)
class TrainingOptions:
    """How to turn an inference model into a train step: loss, frozen parameters, optimizer."""

    loss: str = "mse"
    freeze: tuple[str, ...] = ()
    optimizer: str | None = None
    lr: float = 0.01


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
    original = load.load_model(model)
    load.name_nodes(original)
    load.fix_input_shapes(original, input_shapes or {})
    if mode == "infer":
        return PreparedModel(original, load.infer_shapes(original), None)
    options = training or TrainingOptions()
    graph = build_training_graph(
        load.infer_shapes(original), loss=options.loss, freeze=_matching(original, options.freeze),
        optimizer=options.optimizer, lr=options.lr,
    )
    groups = training_groups(graph.model, graph.backward_groups)
    model = graph.model
    groups, roles = separate_graph_outputs(model, groups, group_roles(groups, graph.backward_groups))
    return PreparedModel(model, load.infer_shapes(model), groups, roles)


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
    budget: str | int | Budget = "100%",
    *,
    mode: str = "infer",
    training: TrainingOptions | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    solver: str = "highs",
    time_limit: float | None = DEFAULT_TIME_LIMIT,
    progress: Progress | None = None,
) -> RematResult:
    """Rewrite `model` (in train mode: its train step) so it runs within `budget` at the least predicted time."""
    budget = _as_budget(budget)
    name = Path(model).name if isinstance(model, (str, Path)) else (model.graph.name or "model")
    prepared = prepare(model, mode, input_shapes, training)
    infos = tensor_infos(prepared.inferred)
    roofline = Roofline()
    costs = {"cpu": lambda n, i: node_seconds(n, i, roofline)}
    graph = build_problem(prepared.inferred, infos, costs, workspace_bytes, prepared.groups, prepared.roles)
    problem, minimum = _with_budget(graph.problem, budget)
    result = solve(problem, solver=solver, time_limit=time_limit, progress=progress)
    check_schedule(problem, result.schedule)
    rewritten = rewrite(prepared.inferred, graph.opmap, result.schedule, problem.devices)
    report = build_report(name, mode, problem, minimum, result)
    forward_count = graph.opmap.roles.count("forward") if graph.opmap.roles else None
    return RematResult(rewritten, result.schedule, problem, report, forward_count)


def _with_budget(problem: Problem, budget: Budget) -> tuple[Problem, int]:
    """Set the budget resolved against keep-all and the minimum, refusing one below the minimum;
    also return the minimum feasible budget."""
    keep = problem.keep_all_bytes()
    minimum = minimum_budget(problem)
    requested = budget.resolve(keep, minimum.feasible)
    if requested < minimum.lower or (requested < minimum.feasible and minimum.lower == minimum.feasible):
        raise InfeasibleBudgetError(
            f"budget {format_bytes(requested)} is below the minimum feasible budget "
            f"{format_bytes(minimum.feasible)} ({minimum.feasible} bytes, "
            f"{100 * minimum.feasible / keep:.1f}% of keep-all): raise --budget to at least that",
            minimum.feasible,
        )
    return replace(problem, budgets=(requested,) * problem.num_devices), minimum.feasible


def build_report(name: str, mode: str, problem: Problem, minimum_bytes: int, result: SolveResult) -> Report:
    """Summarise a solved problem: memory, time, recomputations, solver state and baselines."""
    simulation = simulate(problem, result.schedule)
    costs = problem.cost[0]
    counts: dict[int, int] = {}
    for compute in result.schedule.computes:
        counts[compute.op] = counts.get(compute.op, 0) + 1
    recomputations = tuple(
        Recomputation(problem.op_names[op], n - 1, problem.output_bytes[op], (n - 1) * costs[op])
        for op, n in sorted(counts.items())
        if n > 1
    )
    return Report(
        model=name,
        mode=mode,
        devices=problem.devices,
        num_ops=problem.num_ops,
        budget_bytes=problem.budgets[0],
        keep_all_bytes=problem.keep_all_bytes(),
        minimum_budget_bytes=minimum_bytes,
        resident_bytes=problem.resident_bytes[0],
        predicted_peak_bytes=max(simulation.peak_bytes),
        predicted_seconds=simulation.total_cost,
        keep_all_seconds=sum(costs),
        recomputations=recomputations,
        solver=SolverSummary(result.solver, result.status, result.objective, result.bound, result.gap, result.seconds),
        baselines=_baselines(problem),
    )


def _baselines(problem: Problem) -> dict[str, BaselineResult]:
    """Predicted time and peak of keep-all and Chen's sqrt(n) schedules on this problem."""
    results = {}
    for name, schedule in (("keep-all", keep_all(problem)), ("chen-sqrt-n", chen_sqrt_n(problem))):
        simulation = simulate(problem, schedule)
        peak = max(simulation.peak_bytes)
        results[name] = BaselineResult(simulation.total_cost, peak, peak <= problem.budgets[0])
    return results


def _as_budget(budget: str | int | Budget) -> Budget:
    if isinstance(budget, Budget):
        return budget
    if isinstance(budget, int):
        return Budget(absolute_bytes=budget)
    return parse_budget(budget)


def check_output_path(path: str | Path, source: str | Path | None, force: bool) -> None:
    """Refuse to write over the input or an existing file without force, or into a missing directory."""
    out = Path(path)
    if source is not None and out.resolve() == Path(source).resolve() and not force:
        raise OutputError(f"output {out} is the input file: choose another path or pass --force to overwrite it")
    if out.exists() and not force:
        raise OutputError(f"output {out} already exists: pass --force to overwrite it")
    if not out.parent.is_dir():
        raise OutputError(f"output directory {out.parent} does not exist: create it first")
