"""Solver at scale: training graphs on two devices at 25% of keep-all per device, one row per case.

Device 0 ("fast") costs operators with the analytic roofline model (onnx_remat.passes.cost_analytic), device 1
("slow") is the same model 2.5x slower; a copy costs one byte / the roofline's memory bandwidth per byte. Each
device gets 25% of its keep-all, or, where 25% is below the minimum feasible budget, the smallest equal budget per
device known to be feasible on the two devices (the row says "25% infeasible" where that is proven, "min" with the
feasible budget and the proven lower bound, "=" when they meet).

Columns: the solver's predicted step time (objective), its proven lower bound and gap, and the baselines:
keep-all and Chen sqrt(n) on the fast device (marked * when over budget) and the best single-device schedule.

Run: python tools/bench_solver.py [--time-limit S] [--solver highs] [--cases resnet18,unet,vgg16,vgg19,...]
     [--emit DIR] (also writes each case's problem file, for `onnx-remat solve`)
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace
from pathlib import Path

from onnx_remat import models
from onnx_remat.core.problem import Problem
from onnx_remat.passes.build_problem import build_problem
from onnx_remat.passes.cost_analytic import Roofline, node_seconds
from onnx_remat.passes.simulate import simulate
from onnx_remat.passes.sizes import tensor_infos
from onnx_remat.passes.solve import solve
from onnx_remat.passes.solve.baselines import chen_sqrt_n, keep_all
from onnx_remat.passes.solve.min_budget import equal_budget_lower_bound, fits_equal_budget, minimum_equal_budget
from onnx_remat.passes.workspace import workspace_bytes
from onnx_remat.pipeline import TrainingOptions, prepare
from onnx_remat.problem_file import write_problem

SLOWDOWN = 2.5
FRACTION = 0.25
CASES: dict[str, tuple[str, dict, float]] = {
    "resnet18": ("resnet18", {"batch": 8, "resolution": 224, "width": 64, "num_classes": 1000}, 60.0),
    "unet": ("unet", {"batch": 8}, 60.0),
    "vgg16": ("vgg16", {"batch": 8}, 60.0),
    "vgg19": ("vgg19", {"batch": 8}, 60.0),
    "vgg16-64": ("vgg16", {"batch": 8, "resolution": 64}, 60.0),
    "vgg19-64": ("vgg19", {"batch": 8, "resolution": 64}, 60.0),
    "resnet50": ("resnet50", {"batch": 8}, 300.0),
    "transformer12": ("transformer_encoder", {"batch": 8, "layers": 12}, 300.0),
}
"""Case: model, builder arguments, the issue's time limit in seconds. ResNet18 is the paper's (torchvision's
ResNet18 on ImageNet-sized inputs: 672 MiB keep-all at batch 8, the paper's Fig. 8 has 613.6 MiB); the others
keep the builders' small widths, at which 25% is not infeasible for the parameters and their gradients alone
(at the paper's sizes VGG16 and VGG19 need 36.2% and 34.6% per device, proven); VGG at 32x32 and at 64x64."""


@dataclass(frozen=True)
class Row:
    """One benchmark case: the problem's size and budget, the solver's outcome and the baselines' times."""

    case: str
    ops: int
    devices: int
    budget: str
    solver: str
    status: str
    seconds: float
    objective: float
    bound: float
    gap: float
    keep_all: str
    chen: str
    single: str


def training_problem(model: str, kwargs: dict) -> Problem:
    """The training step's problem on one analytic device, built the way the pipeline builds it."""
    prepared = prepare(models.build(model, **kwargs), "train", None, TrainingOptions())
    infos = tensor_infos(prepared.model)
    roofline = Roofline()
    costs = {"fast": lambda node, i: node_seconds(node, i, roofline)}
    model = prepared.model
    graph = build_problem(model, infos, costs, workspace_bytes, prepared.groups, prepared.roles)
    return graph.problem


def two_devices(problem: Problem, budget: int) -> Problem:
    """A slow copy of device 0 as device 1, copies at the roofline's memory bandwidth, `budget` on each."""
    per_byte = 1.0 / Roofline().bytes_per_second
    return replace(
        problem,
        devices=("fast", "slow"),
        cost=(problem.cost[0], tuple(SLOWDOWN * c for c in problem.cost[0])),
        resident_bytes=(problem.resident_bytes[0],) * 2,
        kept_bytes=(problem.kept_bytes[0],) * 2,
        budgets=(budget, budget),
        copy_seconds_per_byte=((0.0, per_byte), (per_byte, 0.0)),
        copy_fixed_seconds=((0.0, 0.0), (0.0, 0.0)),
    )


def budget_for(problem: Problem) -> tuple[int, str]:
    """25% of keep-all per device if that is not proven infeasible on the two devices and a schedule is known to
    fit it, else the smallest equal budget per device known to be feasible, labelled with the proven lower bound.

    Both numbers are for the two-device problem: its devices share the work, so graph outputs and parked
    tensors may sit on either device, and its minimum is below the one-device minimum."""
    keep = problem.keep_all_bytes()
    wanted = int(FRACTION * keep)
    if wanted >= equal_budget_lower_bound(problem) and fits_equal_budget(problem, wanted):
        return wanted, f"{100 * FRACTION:.0f}%"
    minimum = minimum_equal_budget(problem)
    if wanted >= minimum.feasible:
        return wanted, f"{100 * FRACTION:.0f}%"
    proven = "=" if minimum.lower == minimum.feasible else f">={100 * minimum.lower / keep:.1f}%"
    why = "infeasible" if wanted < minimum.lower else "none found"
    return minimum.feasible, f"{100 * FRACTION:.0f}% {why}; min {100 * minimum.feasible / keep:.1f}% ({proven})"


def baseline_text(problem: Problem, schedule_of) -> str:
    """A baseline's predicted ms on the fast device, starred when it breaks a budget."""
    simulation = simulate(problem, schedule_of(problem))
    over = "" if simulation.peak_bytes[0] <= problem.budgets[0] else "*"
    return f"{simulation.total_cost * 1e3:.3f}{over}"


def run_case(case: str, solver: str, time_limit: float | None, emit: Path | None) -> Row:
    model, kwargs, issue_limit = CASES[case]
    time_limit = issue_limit if time_limit is None else time_limit
    single = training_problem(model, kwargs)
    budget, label = budget_for(two_devices(single, single.keep_all_bytes()))
    problem = two_devices(single, budget)
    if emit is not None:
        write_problem(problem, emit / f"{case}.json")
    start = time.perf_counter()
    result = solve(problem, solver, time_limit)
    seconds = time.perf_counter() - start
    fast = replace(single, budgets=(budget,))
    best_single = "-" if result.single_device_objective is None else f"{result.single_device_objective * 1e3:.3f}"
    return Row(
        case, problem.num_ops, problem.num_devices, label, result.solver, result.status, seconds,
        result.objective, result.bound, result.gap,
        baseline_text(fast, keep_all), baseline_text(fast, chen_sqrt_n), best_single,
    )  # fmt: skip


def print_row(row: Row) -> None:
    print(
        f"| {row.case} | {row.ops} | {row.devices} | {row.budget} | {row.solver} {row.status} | {row.seconds:.1f} | "
        f"{row.objective * 1e3:.3f} | {row.bound * 1e3:.3f} | {100 * row.gap:.2f}% | {row.keep_all} | {row.chen} | "
        f"{row.single} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, help="seconds per case (default: the issue's, 60 or 300)")
    parser.add_argument("--solver", default="highs")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated of {', '.join(CASES)}")
    parser.add_argument("--emit", type=Path, help="directory to write each case's problem file into")
    args = parser.parse_args()
    print(
        "| model (train, batch 8) | T | devices | budget per device | solver, status | time s | objective ms | "
        "bound ms | gap | keep-all ms | Chen sqrt n ms | best single device ms |"
    )
    print("|" + " --- |" * 12)
    for case in args.cases.split(","):
        print_row(run_case(case, args.solver, args.time_limit, args.emit))


if __name__ == "__main__":
    main()
