"""Predicted against measured time of single-device schedules: the default cost model on this machine.

Per model (the bundled fixtures, the paper's networks from `onnx_remat.models`, and torchvision exports from
`real_model_zoo`), mode and budget, `onnx_remat.remat` rewrites it on one onnxruntime CPU device with the default
cost model: at 100%, and by default halfway between the minimum and the peak of computing every operator once, so
that the solver recomputes (1.1 times the minimum where a budget is below it). Then `--rounds` rounds each measure
the costs afresh (a new cache) and predict the schedule's time from them as the summary does (its operators' costs
and a run's overhead, times the load ratio of a run that long against keep-all's: passes/cost_load.py), and run the
rewritten model as `onnx-remat run` does (`--repeats` runs after its warm-up). Predicting and running alternate so
that the load of other processes hits both alike; the table gives the medians over the rounds, the median of the
rounds' ratios with the load ratio and without it (the costs alone), the prediction the summary printed (from the
costs measured first, under the load then) and the cost model it used (a fallback to the roofline is listed with its
reason). A round's measured time is the interquartile mean of its runs, as the costs time whole runs
(`cost_profiled.interquartile_mean`: under load the runs are a mix of ones that kept their core and ones that waited,
whose median jumps from one mode to the other); the ratio to the runs' median, which `onnx-remat run` prints, is
given too.

    python tools/bench_predicted_time.py                                # every model, infer and train, 100% and mid
    python tools/bench_predicted_time.py --models unet_small --modes train --budgets 35% --rounds 5 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import onnx
from rich.console import Console
from rich.table import Table

import onnx_remat
from onnx_remat.core.devices import Device, get_devices
from onnx_remat.execution import input_values
from onnx_remat.models import FIXTURES, build
from onnx_remat.passes.cost_profiled import interquartile_mean
from onnx_remat.passes.run_devices import build_plan, compile_plan, run_plan, warm_up
from onnx_remat.passes.simulate import simulate
from onnx_remat.pipeline import RematOptions, RematResult, costed_problem, prepare

IMAGE_NETWORKS = ("vgg16", "resnet18", "unet")
"""The paper's image networks, built at batch 1 and `--resolution`."""
TRANSFORMER = {"batch": 2, "seq_len": 64, "d_model": 128, "layers": 4}
"""The paper's transformer encoder: 4 layers of width 128 on 2 sequences of 64."""
TORCHVISION = ("resnet18", "mobilenet_v3_small")
"""Exported at batch 2 and 64x64 by `real_model_zoo` (legacy exporter, BatchNorm kept)."""
MODES = ("infer", "train")
TOLERANCE = 0.10
MINIMUM_FACTOR = 1.1


@dataclass(frozen=True)
class Row:
    """One model, mode and budget: the summary's prediction and cost model, and the medians over the rounds."""

    model: str
    mode: str
    budget: str
    recomputations: int
    reported: float
    cost_model: str
    cost_source: str
    predicted: float
    measured: float
    rounds: tuple[tuple[float, float, float, float], ...]
    """Each round's predicted seconds, measured seconds (interquartile mean and median of its runs), and the load
    ratio in the prediction."""

    @property
    def ratio(self) -> float:
        """The median over the rounds of predicted / measured: each round's pair is measured close together."""
        return statistics.median(predicted / measured for predicted, measured, _, _ in self.rounds)

    @property
    def unloaded_ratio(self) -> float:
        """The same without the load ratio: the operators' costs and the run's overhead alone."""
        return statistics.median(predicted / load / measured for predicted, measured, _, load in self.rounds)

    @property
    def median_ratio(self) -> float:
        """The median over the rounds of predicted / the median of the round's runs (what `onnx-remat run` prints)."""
        return statistics.median(predicted / median for predicted, _, median, _ in self.rounds)

    @property
    def load_ratio(self) -> float:
        """The median over the rounds of the load ratio in the prediction."""
        return statistics.median(load for _, _, _, load in self.rounds)


def models(resolution: int, folder: Path) -> dict[str, Callable[[], onnx.ModelProto | str]]:
    """The bundled fixtures by file stem, the paper's networks at batch 1 and `resolution`, and the torchvision
    exports (`tv_<name>`, written into `folder` when first asked for)."""
    found: dict[str, Callable[[], onnx.ModelProto | str]] = {
        path.stem: (lambda path=path: str(path)) for path in sorted(FIXTURES.glob("*.onnx"))}
    found.update({name: (lambda name=name: build(name, batch=1, resolution=resolution)) for name in IMAGE_NETWORKS})
    found["transformer_encoder"] = lambda: build("transformer_encoder", **TRANSFORMER)
    found.update({f"tv_{name}": (lambda name=name: torchvision_export(name, folder)) for name in TORCHVISION})
    return found


def torchvision_export(name: str, folder: Path) -> str:
    """The torchvision network exported by the legacy exporter at batch 2 and 64x64 (imports torch only here)."""
    from real_model_zoo import export

    return str(export(name, "legacy", folder / f"{name}.onnx"))


def rewrite(
    model: onnx.ModelProto | str, budget: str, options: RematOptions, full: RematResult
) -> tuple[RematResult, str]:
    """The model rewritten at `budget`: "mid" is halfway between the minimum and the peak of computing everything
    once (`full`'s report, the rewrite at 100%), where the solver must recompute; a budget below the minimum is
    MINIMUM_FACTOR times the minimum (at the minimum itself the solver may find no schedule in time)."""
    if budget == "mid":
        report = full.report
        assert report.minimum_budget_bytes is not None  # searched by the rewrite at 100% (find_minimum)
        middle = (report.minimum_budget_bytes + report.baselines["keep-all"].peak_bytes) // 2
        return onnx_remat.remat(model, middle, options), f"mid {100 * middle / report.keep_all_bytes:.0f}%"
    try:
        return onnx_remat.remat(model, budget, options), budget
    except onnx_remat.InfeasibleBudgetError as exc:
        above = int(MINIMUM_FACTOR * exc.minimum_bytes)
        return onnx_remat.remat(model, above, options), f"{MINIMUM_FACTOR:g} x min"


def predicted_seconds(model: onnx.ModelProto | str, options: RematOptions, result: RematResult, cost_model: str
                      ) -> tuple[float, float]:
    """The schedule's time predicted from costs measured now (a fresh cache) as the summary does: its operators and a
    run's overhead, times the load ratio of a run that long against keep-all's; and that load ratio."""
    with tempfile.TemporaryDirectory() as cache:
        costed = costed_problem(prepare(model, options.mode), get_devices(options.devices), cost_model, cache)
    if costed.problem.op_names != result.problem.op_names:
        raise RuntimeError("preparing the model twice gave different operators")
    problem = replace(costed.problem, budgets=result.problem.budgets)
    seconds = simulate(problem, result.schedule).total_cost + costed.run_overhead
    keep_all = min(sum(costs) for costs in problem.cost) + costed.run_overhead
    load = costed.load_ratio(seconds, keep_all)
    return seconds * load, load


def measure(name: str, model: onnx.ModelProto | str, budget: str, options: RematOptions, full: RematResult,
            args: argparse.Namespace) -> Row:
    """Rewrite one model at one budget, then alternate predicting and running its schedule for `args.rounds`."""
    result, used = (full, budget) if budget == "100%" else rewrite(model, budget, options, full)
    report = result.report
    predicted, measured, medians, loads = [], [], [], []
    for _ in range(args.rounds):
        seconds, load = predicted_seconds(model, options, result, report.cost_model)
        predicted.append(seconds)
        loads.append(load)
        runs = run_seconds(result.model, options.devices, args.repeats)
        measured.append(interquartile_mean(runs))
        medians.append(statistics.median(runs))
    recomputations = sum(r.extra_computations for r in report.recomputations)
    return Row(name, options.mode, used, recomputations, report.predicted_seconds, report.cost_model,
               report.cost_source, statistics.median(predicted), statistics.median(measured),
               tuple(zip(predicted, measured, medians, loads, strict=True)))


def run_seconds(model: onnx.ModelProto, devices: tuple[Device, ...], repeats: int) -> list[float]:
    """Wall seconds of `repeats` runs of the rewritten model as `onnx-remat run` times them (its plan, its warm-up,
    its random inputs)."""
    plan = build_plan(model, devices)
    runtimes, calls = compile_plan(plan)
    feeds = input_values(model, None)
    warm_up(plan, runtimes, calls, feeds)
    return [run_plan(plan, runtimes, calls, feeds)[1][0] for _ in range(repeats)]


def table(rows: list[Row], title: str) -> Table:
    """Model, mode, budget, recomputations, the summary's prediction, the medians predicted and measured, the load
    ratio in the prediction, and predicted / measured with it and without it, and with it against the runs' median."""
    out = Table(title=title)
    within = f"within {100 * TOLERANCE:.0f}%"
    for column in ("model", "mode", "budget", "recomputes", "costs", "summary ms", "predicted ms", "measured ms",
                   "load ratio", "ratio", within, "ratio without load", f"{within} without", "ratio to median",
                   f"{within} to median"):
        out.add_column(column, justify="left" if column in ("model", "mode", "budget", "costs") else "right")
    for r in rows:
        out.add_row(r.model, r.mode, r.budget, str(r.recomputations), r.cost_model, f"{r.reported * 1e3:.3f}",
                    f"{r.predicted * 1e3:.3f}", f"{r.measured * 1e3:.3f}", f"{r.load_ratio:.3f}", f"{r.ratio:.3f}",
                    _within(r.ratio), f"{r.unloaded_ratio:.3f}", _within(r.unloaded_ratio), f"{r.median_ratio:.3f}",
                    _within(r.median_ratio))
    return out


def _within(ratio: float) -> str:
    return "yes" if abs(ratio - 1) <= TOLERANCE else "NO"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", help="fixture stems, paper networks or tv_<torchvision name> "
                        "(default: all)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--budgets", default="100%,mid",
                        help="budgets, one row each: mid is halfway between the minimum and the peak without "
                        "recomputation (default 100%%,mid; 1.1 x the minimum where one is below it)")
    parser.add_argument("--threads", type=int, help="onnxruntime's intra-op threads (default: its own choice, "
                        "one per core)")
    parser.add_argument("--resolution", type=int, default=32, help="the paper networks' input size (default 32)")
    parser.add_argument("--time-limit", type=float, default=20.0, help="seconds per rewrite (default 20)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of predicting and running (default 3)")
    parser.add_argument("--repeats", type=int, default=50, help="timed runs per round (default 50, as many as the "
                        "costs time whole runs at most)")
    args = parser.parse_args()
    console = Console(width=200)
    devices = tuple(replace(device, threads=args.threads) for device in get_devices(None))
    with tempfile.TemporaryDirectory() as folder:
        available = models(args.resolution, Path(folder))
        chosen = args.models or list(available)
        if unknown := [name for name in chosen if name not in available]:
            parser.error(f"unknown model {unknown[0]!r}: choose from {', '.join(available)}")
        rows, failures = [], []
        for name in chosen:
            model = available[name]()
            for mode in args.modes:
                options = RematOptions(mode=mode, time_limit=args.time_limit, devices=devices)
                full = onnx_remat.remat(model, "100%", options)
                for budget in args.budgets.split(","):
                    try:
                        rows.append(measure(name, model, budget, options, full, args))
                    except onnx_remat.SolverError as exc:  # nothing to run: say so and go on
                        failures.append(f"{name} {mode} at {budget}: {exc}")
                        console.print(failures[-1], highlight=False)
                        continue
                    r = rows[-1]
                    rounds = ", ".join(f"{p * 1e3:.3f}/{m * 1e3:.3f} (x{load:.2f})" for p, m, _, load in r.rounds)
                    console.print(f"{name} {mode} at {r.budget}: ratio {r.ratio:.3f}; predicted/measured ms (load "
                                  f"ratio) by round: {rounds}", highlight=False)
    threads = f"{args.threads} threads" if args.threads else "default threads"
    title = (f"predicted against measured time, one onnxruntime CPU device ({threads}), {args.rounds} rounds of "
             f"{args.repeats} runs (interquartile means; medians over the rounds)")
    console.print(table(rows, title))
    for r in rows:
        if r.cost_model == "analytic":
            console.print(f"roofline for {r.model} {r.mode} at {r.budget}: {r.cost_source}", highlight=False)
    for failure in failures:
        console.print(f"not measured: {failure}", highlight=False)


if __name__ == "__main__":
    main()
