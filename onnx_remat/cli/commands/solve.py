"""`onnx-remat solve FILE.json`: solve a problem file (see onnx_remat.problem_file) and compare with the baselines.

Reproduces a solver run on an identical graph without the model: prints status, objective, bound, gap and time,
and the baselines (keep-all, Chen sqrt(n), the best single-device schedule); `--report` writes them as JSON
together with the schedule.
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from onnx_remat.cli.arguments import add_output_options, add_solver_options
from onnx_remat.core.budget import Budget, format_bytes
from onnx_remat.core.devices import parse_device_budgets
from onnx_remat.core.files import check_outputs, write_atomically
from onnx_remat.core.options import DEFAULT_TIME_LIMIT, LAST_SECONDS
from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute, Copy, Event, Schedule
from onnx_remat.problem_file import read_problem

if TYPE_CHECKING:
    from onnx_remat.passes.solve import SolveResult

SHOWN_BASELINES = ("keep-all", "chen-sqrt-n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnx-remat solve",
        description="Solve a problem file written by --emit-problem (or by hand, see onnx_remat/problem_file.py) "
        "and compare the schedule with the baselines.",
    )
    parser.add_argument("problem", help="the problem file (JSON)")
    add_solver_options(parser, DEFAULT_TIME_LIMIT, "the whole command's time; the solver stops then with the best "
                       "schedule found")
    parser.add_argument(
        "--budget",
        help="override the file's budgets: one budget for every device (512MiB, 25%% of the device's keep-all, "
        "min) or per device as NAME=B,NAME=B",
    )
    parser.add_argument("--report", metavar="FILE.json", help="write status, bound, baselines and the schedule as JSON")
    add_output_options(parser)
    return parser


def run(args: argparse.Namespace, console: Console) -> None:
    """Read the problem, start the CP-SAT worker if it may be needed, solve and report."""
    if args.report:
        check_outputs([args.report], args.problem, args.force)
    problem = read_problem(args.problem)
    with _cpsat_started_early(problem, args.solver):
        solve_and_report(args, console, problem, args.started)


def _cpsat_started_early(problem: Problem, solver: str) -> AbstractContextManager[None]:
    """Start the CP-SAT worker now when the solve may run it (one device: the portfolio, or --solver cpsat), so that
    its OR-Tools import (0.3-0.5 s) overlaps the baselines, the memory-cut bound and building the model."""
    from onnx_remat.passes.solve.child import started_early
    from onnx_remat.passes.solve.cpsat import WORKER

    if problem.num_devices == 1 and solver in ("auto", "cpsat"):
        return started_early(WORKER)
    return nullcontext()


def solve_and_report(args: argparse.Namespace, console: Console, problem: Problem, started: float) -> None:
    """Set the budgets, solve with live progress, print the comparison, write the report."""
    from onnx_remat.passes.solve import solve

    hints: tuple[Schedule, ...] = ()
    if args.budget:
        problem, hints = with_budgets(problem, args.budget, args.time_limit)
    with console.status("solving", spinner="dots") as status:

        def progress(elapsed: float, incumbent: float | None, bound: float | None) -> None:
            status.update(f"solving: {elapsed:.1f} s, {_progress_text(incumbent, bound)}")

        left = max(LAST_SECONDS, args.time_limit - (time.perf_counter() - started))
        result = solve(problem, args.solver, left, progress, hints)
    baselines = baseline_rows(problem)
    for line in summary_lines(problem, result, baselines):
        console.print(line, highlight=False)
    if args.report:
        check_outputs([args.report], args.problem, args.force)
        text = json.dumps(report(args.problem, problem, result, baselines), indent=1)
        write_atomically(Path(args.report), (text + "\n").encode())


def with_budgets(problem: Problem, text: str, time_limit: float) -> tuple[Problem, tuple[Schedule, ...]]:
    """`problem` with the budgets of `--budget` (one for all devices, or NAME=B for some of them, the others keeping
    the file's) resolved as the main command resolves them; also the schedules reaching the minima searched."""
    from onnx_remat.resolve import Minima, resolve_budgets, search_seconds

    given = parse_device_budgets(text, problem.devices)
    budgets = [given.get(name, Budget(absolute_bytes=budget)) for name, budget in zip(problem.devices, problem.budgets,
                                                                                      strict=True)]
    resolved = resolve_budgets(Minima(problem), budgets, False, search_seconds(time_limit, budgets))
    return replace(problem, budgets=resolved.budgets), resolved.reached


def baseline_rows(problem: Problem) -> dict[str, dict[str, Any]]:
    """Predicted seconds, peak bytes per device and whether it fits, for keep-all and Chen on each device."""
    from onnx_remat.passes.solve.baselines import baselines_of

    return {baseline.name: {"seconds": baseline.total_cost, "peak_bytes": list(baseline.peak_bytes),
                            "fits": baseline.fits(problem.budgets)}
            for baseline in baselines_of(problem) if baseline.name.split("@")[0] in SHOWN_BASELINES}


def summary_lines(problem: Problem, result: SolveResult, baselines: dict[str, dict[str, Any]]) -> list[str]:
    """The printed summary: problem size, budgets, solver outcome, predicted peaks and the baselines."""
    peaks = result.simulation.peak_bytes
    budgets = ", ".join(
        f"{name} {format_bytes(budget)} (peak {format_bytes(peak)})"
        for name, budget, peak in zip(problem.devices, problem.budgets, peaks, strict=True)
    )
    lines = [
        f"problem: {problem.num_ops} operators, {len(problem.edges)} edges, {problem.num_devices} device(s)",
        f"budgets: {budgets}",
        f"solver: {result.solver} {result.status} in {result.seconds:.1f} s",
        f"objective {_ms(result.objective)}, bound {_ms(result.bound)}, gap {100 * result.gap:.2f}%",
        f"recomputations: {result.schedule.recompute_count()}, copies: "
        f"{sum(isinstance(e, Copy) for e in result.schedule.events)}",
    ]
    for name, row in baselines.items():
        fits = "fits" if row["fits"] else "over budget"
        lines.append(f"baseline {name}: {_ms(row['seconds'])}, peak {format_bytes(max(row['peak_bytes']))}, {fits}")
    single = result.single_device_objective
    lines.append(f"best single device: {'none fits' if single is None else _ms(single)}")
    return lines


def report(source: str, problem: Problem, result: SolveResult, baselines: dict[str, dict[str, Any]]) -> dict:
    """The JSON report: the problem file, budgets, the solver outcome, the baselines and the schedule."""
    outcome = asdict(result)
    outcome.pop("schedule")
    outcome.pop("simulation")
    return {
        "problem": str(source),
        "devices": list(problem.devices),
        "budget_bytes": list(problem.budgets),
        "peak_bytes": list(result.simulation.peak_bytes),
        **outcome,
        "recomputations": result.schedule.recompute_count(),
        "baselines": baselines,
        "schedule": [_event_json(event) for event in result.schedule.events],
    }


def _event_json(event: Event) -> dict[str, Any]:
    """One schedule event as {"kind": compute|free|copy, ...its fields}."""
    kind = "compute" if isinstance(event, Compute) else "copy" if isinstance(event, Copy) else "free"
    return {"kind": kind, **asdict(event)}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _progress_text(incumbent: float | None, bound: float | None) -> str:
    """Incumbent, bound and gap as the live progress line shows them."""
    best = "-" if incumbent is None else _ms(incumbent)
    low = "-" if bound is None else _ms(bound)
    gap = f", gap {100 * (incumbent - bound) / incumbent:.2f}%" if incumbent and bound is not None else ""
    return f"incumbent {best}, bound {low}{gap}"
