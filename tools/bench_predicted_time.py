"""Predicted against measured time of single-device schedules: the default cost model on this machine.

Per model (the bundled fixtures and the paper's networks, `onnx_remat.models`) and mode, `onnx_remat.remat`
rewrites it on one onnxruntime CPU device with the default cost model at `--budget` (1.1 times its minimum where
that is below; the next budget where the solver finds no schedule in the time limit). Then `--rounds` rounds each
measure the costs afresh (a new cache) and predict the schedule's time from them (its operators' costs and a run's
overhead, as the summary does), and run the rewritten model as `onnx-remat run` does (the median of `--repeats`
runs after a warm-up). Predicting and running alternate so that the load of other processes hits both alike; the
table gives the medians over the rounds, the median of the rounds' ratios, and the prediction the summary printed
(from the costs measured first, under the load then).

    python tools/bench_predicted_time.py                                # every model, infer and train, ~10 minutes
    python tools/bench_predicted_time.py --models unet_small --modes train --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass, replace

import onnx
from rich.console import Console
from rich.table import Table

import onnx_remat
from onnx_remat.core.devices import get_devices
from onnx_remat.core.problem import Problem
from onnx_remat.models import FIXTURES, build
from onnx_remat.passes.simulate import simulate
from onnx_remat.pipeline import RematResult, costed_problem, prepare

PAPER_NETWORKS = ("vgg16", "resnet18", "unet")
MODES = ("infer", "train")
TOLERANCE = 0.10
MINIMUM_FACTOR = 1.1


@dataclass(frozen=True)
class Row:
    """One model and mode: the budget used, the summary's prediction, and the medians over the rounds."""

    model: str
    mode: str
    budget: str
    recomputations: int
    reported: float
    cost_model: str
    predicted: float
    measured: float
    rounds: tuple[tuple[float, float], ...]
    """Each round's predicted and measured seconds."""

    @property
    def ratio(self) -> float:
        """The median over the rounds of predicted / measured: each round's pair is measured close together."""
        return statistics.median(predicted / measured for predicted, measured in self.rounds)


def models(resolution: int) -> dict[str, onnx.ModelProto | str]:
    """The bundled fixtures by file stem, then the paper's networks at batch 1 and `resolution`."""
    found: dict[str, onnx.ModelProto | str] = {path.stem: str(path) for path in sorted(FIXTURES.glob("*.onnx"))}
    found.update({name: build(name, batch=1, resolution=resolution) for name in PAPER_NETWORKS})
    return found


def rewrite(model: onnx.ModelProto | str, mode: str, budgets: list[str], time_limit: float) -> tuple[RematResult, str]:
    """The model rewritten with the default cost model at the first of `budgets` the solver finds a schedule for in
    `time_limit`; a budget below the minimum becomes MINIMUM_FACTOR times the minimum (at the minimum itself the
    solver may find none)."""
    for budget in budgets:
        try:
            try:
                return onnx_remat.remat(model, budget, mode=mode, time_limit=time_limit), budget
            except onnx_remat.InfeasibleBudgetError as exc:
                above = int(MINIMUM_FACTOR * exc.minimum_bytes)
                return onnx_remat.remat(model, above, mode=mode, time_limit=time_limit), f"{MINIMUM_FACTOR:g} x min"
        except onnx_remat.SolverError as exc:
            failure = exc
    raise failure


def predicted_seconds(model: onnx.ModelProto | str, mode: str, result: RematResult, cost_model: str) -> float:
    """The schedule's time predicted from costs measured now (a fresh cache): its operators and a run's overhead."""
    devices = get_devices(None)
    with tempfile.TemporaryDirectory() as cache:
        graph, profiled = costed_problem(prepare(model, mode), devices, cost_model, cache)
    problem: Problem = replace(graph.problem, budgets=result.problem.budgets)
    if problem.op_names != result.problem.op_names:
        raise RuntimeError("preparing the model twice gave different operators")
    overhead = profiled.run_overhead_seconds[devices[0].name] if profiled else 0.0
    return simulate(problem, result.schedule).total_cost + overhead


def measure(name: str, model: onnx.ModelProto | str, mode: str, args: argparse.Namespace) -> Row:
    """Rewrite one model, then alternate predicting and running its schedule for `args.rounds` rounds."""
    result, budget = rewrite(model, mode, args.budget.split(","), args.time_limit)
    report = result.report
    predicted, measured = [], []
    for _ in range(args.rounds):
        predicted.append(predicted_seconds(model, mode, result, report.cost_model))
        measured.append(onnx_remat.run_on_devices(result.model, "cpu", repeats=args.repeats,
                                                  measure_memory=False).seconds)
    recomputations = sum(r.extra_computations for r in report.recomputations)
    return Row(name, mode, budget, recomputations, report.predicted_seconds, report.cost_model,
               statistics.median(predicted), statistics.median(measured), tuple(zip(predicted, measured, strict=True)))


def table(rows: list[Row], title: str) -> Table:
    """Model, mode, budget, recomputations, the summary's prediction, the medians predicted and measured, ratio."""
    out = Table(title=title)
    for column in ("model", "mode", "budget", "recomputes", "costs", "summary ms", "predicted ms", "measured ms",
                   "ratio", f"within {100 * TOLERANCE:.0f}%"):
        out.add_column(column, justify="left" if column in ("model", "mode", "budget", "costs") else "right")
    for r in rows:
        out.add_row(r.model, r.mode, r.budget, str(r.recomputations), r.cost_model, f"{r.reported * 1e3:.3f}",
                    f"{r.predicted * 1e3:.3f}", f"{r.measured * 1e3:.3f}", f"{r.ratio:.3f}",
                    "yes" if abs(r.ratio - 1) <= TOLERANCE else "NO")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", help="fixture stems or paper networks (default: all)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--budget", default="35%,50%",
                        help="budget of every rewrite, then the next where the solver finds no schedule in time "
                        "(default 35%%,50%%; 1.1 x the minimum where one is below it)")
    parser.add_argument("--resolution", type=int, default=32, help="the paper networks' input size (default 32)")
    parser.add_argument("--time-limit", type=float, default=20.0, help="seconds per rewrite (default 20)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of predicting and running (default 3)")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per round, median (default 20)")
    args = parser.parse_args()
    console = Console(width=160)
    available = models(args.resolution)
    chosen = args.models or list(available)
    if unknown := [name for name in chosen if name not in available]:
        parser.error(f"unknown model {unknown[0]!r}: choose from {', '.join(available)}")
    rows, failures = [], []
    for name in chosen:
        for mode in args.modes:
            try:
                rows.append(measure(name, available[name], mode, args))
            except onnx_remat.SolverError as exc:  # nothing to run: say so and go on
                failures.append(f"{name} {mode}: {exc}")
                console.print(failures[-1], highlight=False)
                continue
            r = rows[-1]
            rounds = ", ".join(f"{p * 1e3:.3f}/{m * 1e3:.3f}" for p, m in r.rounds)
            console.print(f"{name} {mode} at {r.budget}: ratio {r.ratio:.3f}; predicted/measured ms by round: {rounds}",
                          highlight=False)
    title = (f"predicted against measured time, one onnxruntime CPU device, {args.rounds} rounds of "
             f"{args.repeats} runs (medians)")
    console.print(table(rows, title))
    for failure in failures:
        console.print(f"not measured: {failure}", highlight=False)


if __name__ == "__main__":
    main()
