"""The XEngine paper's Table 1 shape on this machine: best single-device schedule against the mixed schedule.

Two devices from a device file (default `devices/ort-cpu+ov-cpu.toml`: onnxruntime CPU and OpenVINO CPU, one
thread each, the paper's CPU+GPU pair), measured costs (profiled and cached). Per network and mode, at 100% of
keep-all on every device and at a tight budget (each device at `--tight` times its single-device minimum, at
most keep-all): the predicted time of the solver's schedule on each device alone, of the mixed schedule and its
difference in percent against the best single device, and the measured time (median of `--repeats` runs) of the
single-device schedules and of the mixed one, each rewritten and executed on its devices' runtimes with their
thread limits (`onnx_remat.run_on_devices`: per-device segments, tensors handed across at the copy nodes), with
the mixed execution's per-device peaks, predicted and measured (a fresh process, the high-water mark reset around
every step: `passes/measure_devices.py`), against the budgets; within/OVER goes by the measured peaks; and what
`--pick-by-running` keeps (the solver's schedule and each device's best alone run in turns, median of 15
rounds). The last row is a case where only a mixed schedule fits: each budget below its device's single-device
minimum. Schedules leave `--headroom` of each budget free (default 3%: the mixed-only schedule measured 1-4% over
its predicted peak on onnxruntime in five repeats without it).

    python tools/bench_table1.py                                   # VGG16, ResNet18, UNet, ~10 minutes
    python tools/bench_table1.py --networks unet --batch 1 --resolution 32 --time-limit 30
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace

import onnx
from rich.console import Console
from rich.table import Table

from onnx_remat.core.budget import Budget, format_bytes
from onnx_remat.core.devices import Device, get_devices
from onnx_remat.core.errors import RematError
from onnx_remat.core.opmap import OpMap
from onnx_remat.core.options import MINIMUM_SECONDS
from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute, Copy
from onnx_remat.models import build
from onnx_remat.passes.execute import random_feeds
from onnx_remat.passes.measure_devices import with_measured_peaks
from onnx_remat.passes.rewrite import rewrite
from onnx_remat.passes.run_devices import DeviceRun, build_plan, execute
from onnx_remat.passes.solve import SolveResult, solve
from onnx_remat.passes.solve.baselines import on_device
from onnx_remat.passes.solve.min_budget import minimum_budget
from onnx_remat.pipeline import (
    PreparedModel,
    costed_problem,
    faster_by_running,
    prepare,
    with_headroom,
)
from onnx_remat.report import MeasuredChoice
from onnx_remat.resolve import Minima, resolve_budgets

DEFAULT_DEVICES = "devices/ort-cpu+ov-cpu.toml"
MIB = 1 << 20
NETWORKS = ("vgg16", "resnet18", "unet")
MODES = ("infer", "train")


@dataclass(frozen=True)
class Single:
    """One device alone: predicted seconds of the solver's schedule and its measured seconds (None: does not fit)."""

    predicted: float | None
    measured: float | None


@dataclass(frozen=True)
class Row:
    """One line of the table: a network, mode and budget; each device alone and the mixed schedule."""

    case: str
    budgets: tuple[int, ...]
    keep_all: tuple[int, ...]
    singles: tuple[Single, ...]
    mixed: SolveResult
    mixed_run: DeviceRun
    devices_used: int
    copies: int
    picked: MeasuredChoice | None


@dataclass(frozen=True)
class Setting:
    """What every case of one network and mode shares: the model, its operators, the devices and the run options."""

    prepared: PreparedModel
    opmap: OpMap
    devices: tuple[Device, ...]
    time_limit: float
    repeats: int
    headroom: float


def solve_case(setting: Setting, problem: Problem, case: str) -> Row:
    """Solve `problem` (budgets set, the setting's headroom of each left free) on each device alone and on all;
    execute and time every schedule."""
    prepared, opmap, devices = setting.prepared, setting.opmap, setting.devices
    time_limit, repeats, headroom = setting.time_limit, setting.repeats, setting.headroom
    planned = with_headroom(problem, headroom, (0,) * problem.num_devices)
    singles = []
    for d, device in enumerate(devices):
        alone = on_device(planned, d)
        try:
            result = solve(alone, time_limit=time_limit)
        except RematError:
            singles.append(Single(None, None))
            continue
        model = rewrite(prepared.model, opmap, result.schedule, alone.devices)
        singles.append(Single(result.objective, measure(model, (device,), repeats, problem.budgets[d:d + 1]).seconds))
    mixed = solve(planned, time_limit=time_limit)
    used = {event.device for event in mixed.schedule.events if isinstance(event, Compute)}
    copies = sum(isinstance(event, Copy) for event in mixed.schedule.events)
    model = rewrite(prepared.model, opmap, mixed.schedule, problem.devices)
    mixed_run = measure(model, devices, repeats, problem.budgets, memory=True)
    keep = tuple(problem.keep_all_bytes(d) for d in range(problem.num_devices))
    _, picked = faster_by_running(prepared, opmap, problem, mixed, devices)
    return Row(case, problem.budgets, keep, tuple(singles), mixed, mixed_run, len(used), copies, picked)


def measure(
    model: onnx.ModelProto, devices: tuple[Device, ...], repeats: int, budgets: tuple[int, ...], memory: bool = False
) -> DeviceRun:
    """`model` executed on `devices` (each device's segments on its runtime with its thread limit): median seconds
    of `repeats` runs and predicted per-device peaks against `budgets`; with `memory` also the measured peaks
    (`passes/measure_devices.py`: a fresh process, the high-water mark reset around every step)."""
    named = {device.name: budget for device, budget in zip(devices, budgets, strict=True)}
    plan, feeds = build_plan(model, devices), random_feeds(model, seed=0)
    run = execute(plan, feeds, repeats, named)
    return with_measured_peaks(run, plan, feeds) if memory else run


def single_minima(problem: Problem) -> list[int]:
    """Each device's minimum budget when it runs everything alone."""
    return [minimum_budget(on_device(problem, d)).feasible for d in range(problem.num_devices)]


def budgets(problem: Problem, values: list[int]) -> Problem:
    """`problem` with these budgets in bytes, checked against each device's minimum (with the others' budgets)."""
    wanted = [Budget(absolute_bytes=value) for value in values]
    return replace(problem, budgets=resolve_budgets(Minima(problem), wanted, True, MINIMUM_SECONDS).budgets)


def mixed_only_candidates(problem: Problem, alone: list[int]) -> list[list[int]]:
    """Budgets each below its device's single-device minimum, to try in turn for a case only a mixed schedule fits:
    the first device at 97% of its minimum and the second halfway between its minimum then and its single-device
    minimum (when that minimum, found by `resolve_budgets`, is lower), then both devices at 95% and at 90% of their
    single-device minima (`resolve_budgets` finds no lower minimum for the second device when every parameter is
    resident on both and the split that fits is of the gradients: the solver still may)."""
    candidates = []
    first = int(0.97 * alone[0])
    try:
        wanted = [Budget(absolute_bytes=first), Budget(minimum=True)]
        minima = resolve_budgets(Minima(problem), wanted, True, MINIMUM_SECONDS).minima
        if minima[1].feasible < alone[1]:
            candidates.append([first, (minima[1].feasible + alone[1]) // 2])
    except RematError:
        pass
    return candidates + [[int(below * a) for a in alone] for below in (0.95, 0.9)]


def mixed_only_row(setting: Setting, problem: Problem, case: str) -> Row | None:
    """The first candidate budgets where the solver finds a mixed schedule and neither device fits alone."""
    alone = single_minima(problem)
    for values in mixed_only_candidates(problem, alone):
        try:
            row = solve_case(setting, budgets(problem, values), case)
        except RematError:
            continue
        if all(single.predicted is None for single in row.singles):
            return row
    return None


def ms(seconds: float | None) -> str:
    return "does not fit" if seconds is None else f"{1e3 * seconds:.3f}"


def percent(value: float, best: float | None) -> str:
    """`value` against `best` in percent, or - without a best."""
    return "-" if best is None else f"{100 * (value / best - 1):+.1f}%"


def peaks(run: DeviceRun) -> str:
    """Each device's predicted / measured peak in MiB against its budget, then within or OVER (by the measured)."""
    measured = run.measured_peak_bytes or {}
    parts = [
        f"{run.predicted_peak_bytes[name] / MIB:.2f}/{measured[name] / MIB:.2f} of {budget / MIB:.2f}"
        if name in measured and budget is not None else "-"
        for name, budget in run.budgets.items()
    ]
    return f"{'; '.join(parts)} {'within' if run.within_budgets else 'OVER'}"


def add_row(table: Table, row: Row) -> None:
    """One table line: budgets, each device alone (predicted / measured), mixed predicted and measured with their
    differences to the best single device, whether the mixed run's peaks fit, placement, solver."""
    best = min((s.predicted for s in row.singles if s.predicted is not None), default=None)
    best_measured = min((s.measured for s in row.singles if s.measured is not None), default=None)
    budget = ", ".join(
        f"{format_bytes(b)} ({100 * b / k:.0f}%)" for b, k in zip(row.budgets, row.keep_all, strict=True)
    )
    cells = [row.case, budget]
    for single in row.singles:
        cells.append(f"{ms(single.predicted)} / {ms(single.measured)}" if single.predicted else ms(None))
    placement = f"{row.devices_used} device{'s' * (row.devices_used > 1)}, {row.copies} copies"
    cells += [
        ms(row.mixed.objective),
        percent(row.mixed.objective, best),
        ms(row.mixed_run.seconds),
        percent(row.mixed_run.seconds, best_measured),
        peaks(row.mixed_run),
        placement,
        f"{row.mixed.status} {100 * row.mixed.gap:.1f}%",
        "-" if row.picked is None else f"{row.picked.kept}; "
        + ", ".join(f"{name} {ms(seconds)}" for name, seconds in row.picked.seconds.items()),
    ]
    table.add_row(*cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default=DEFAULT_DEVICES, help=f"device file or preset (default {DEFAULT_DEVICES})")
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=NETWORKS)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    parser.add_argument("--resolution", type=int, default=32, help="input height and width (default 32)")
    parser.add_argument("--tight", type=float, default=1.1, help="tight budget: x single-device minimum (1.1)")
    parser.add_argument("--mixed-only", default="vgg16", choices=NETWORKS, help="network of the mixed-only case")
    parser.add_argument("--headroom", type=float, default=0.03,
                        help="share of each budget the schedules leave free (default 0.03: multi-device runs measure "
                        "1-4%% over the predicted peak)")
    parser.add_argument("--cost-model", default="profiled", choices=("profiled", "in-graph"),
                        help="measured costs: each operator alone (default) or inside whole-model runs")
    parser.add_argument("--time-limit", type=float, default=30.0, help="solver seconds per solve (default 30)")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per measurement, median (default 20)")
    args = parser.parse_args()
    devices = get_devices(args.devices)
    if len(devices) != 2:
        parser.error("the table compares two devices: give a device file with two")
    console = Console(width=200)
    names = [d.name for d in devices]
    table = Table(
        title=f"Table 1 shape: {' + '.join(names)}, batch {args.batch}, {args.resolution}x{args.resolution}, "
        f"{args.cost_model} costs; "
        f"times in ms, predicted / measured (median of {args.repeats})"
    )
    for column in (
        "case",
        "budget per device",
        *(f"{n} alone" for n in names),
        "mixed pred.",
        "diff",
        "mixed meas.",
        "meas. diff",
        "mixed peaks MiB pred./meas. of budget",
        "mixed placement",
        "solver",
        "--pick-by-running: kept; measured ms",
    ):
        table.add_column(
            column,
            justify="right" if column in ("mixed pred.", "diff", "mixed meas.", "meas. diff") or "alone" in column
            else "left",
        )
    for network in args.networks:
        for mode in args.modes:
            started = time.perf_counter()
            prepared = prepare(build(network, batch=args.batch, resolution=args.resolution), mode)
            graph = costed_problem(prepared, devices, args.cost_model)
            problem = graph.problem
            setting = Setting(prepared, graph.opmap, devices, args.time_limit, args.repeats, args.headroom)
            alone = single_minima(problem)
            cases = [
                ("100%", [problem.keep_all_bytes(d) for d in range(2)]),
                (
                    f"{args.tight:g} x min",
                    [min(int(args.tight * m), problem.keep_all_bytes(d)) for d, m in enumerate(alone)],
                ),
            ]
            for label, values in cases:
                row = solve_case(setting, budgets(problem, values), f"{network} {mode} T={problem.num_ops} {label}")
                add_row(table, row)
            if network == args.mixed_only and mode == "train":
                case = f"{network} {mode} T={problem.num_ops} mixed only"
                row = mixed_only_row(setting, problem, case)
                if row is None:
                    console.print(f"{network} {mode}: no budgets found where only a mixed schedule fits")
                else:
                    add_row(table, row)
            console.print(f"done: {network} {mode} in {time.perf_counter() - started:.0f} s", highlight=False)
    console.print(table)


if __name__ == "__main__":
    main()
