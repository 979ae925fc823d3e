"""The XEngine paper's Table 1 and Table 2 shapes, for this machine: training time at full and at low budget.

Table 1 (paper: runtimes with sufficient budget): per network and batch size, the keep-all budget and the
predicted and measured time of one training step. Table 2 (paper: full and 25% budget): the same at 25%
of keep-all, with the overhead against the full budget; where 25% is infeasible the row says so and runs at
the minimum feasible budget instead (its percentage of keep-all shown). By default one device (onnxruntime
CPU, the default cost model: measured on this machine); with --devices the paper's mixed setting: measured costs on
every device, each budget per device; either way the rewritten model is executed on its devices as `onnx-remat run`
does (onnx_remat.run_on_devices); the budget column then shows the fullest device.

    python tools/paper_tables.py                       # ResNet18 and U-Net, two batch sizes each, ~3-5 minutes
    python tools/paper_tables.py --cases resnet18:2,4,8 vgg16:2 --low 25% --time-limit 60
    python tools/paper_tables.py --devices devices/ort-cpu+ov-cpu.toml
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

import onnx_remat
from onnx_remat.core.budget import format_bytes
from onnx_remat.models import build

DEFAULT_CASES = ("resnet18:2,4", "unet:1,2")
BUILDER_ARGS = {"resnet18": {"resolution": 64}, "resnet34": {"resolution": 64}, "unet": {"resolution": 64}}


@dataclass(frozen=True)
class Run:
    """One solved and measured training step: the budget used, predicted and measured time, recomputations."""

    budget_label: str
    budget_bytes: int
    keep_all_bytes: int
    predicted_seconds: float
    measured_seconds: float
    recomputations: int
    status: str


def solve_and_measure(
    network: str, batch: int, budget: str, time_limit: float, repeats: int, devices: str | None, keep_all: int = 0
) -> Run:
    """Rematerialize the training step of `network` at `batch` within `budget` (on `devices`, or one CPU) and
    measure it; if `budget` is infeasible, at the minimum (several devices: at the smallest percentage of
    `keep_all` that the error allows, the same for every device)."""
    model = build(network, batch=batch, **BUILDER_ARGS.get(network, {}))
    label = budget
    try:
        result = onnx_remat.remat(model, budget, mode="train", time_limit=time_limit, devices=devices)
    except onnx_remat.InfeasibleBudgetError as exc:
        fallback = "min" if devices is None else _uniform_fallback(exc, budget, keep_all)
        result = onnx_remat.remat(model, fallback, mode="train", time_limit=time_limit, devices=devices)
        label = f"{budget} infeasible -> {fallback}"
    report = result.report
    measured = onnx_remat.run_on_devices(result.model, devices, repeats=repeats, measure_memory=False).seconds
    return Run(
        label,
        report.budget_bytes,
        report.keep_all_bytes,
        report.predicted_seconds,
        measured,
        sum(r.extra_computations for r in report.recomputations),
        f"{report.solver.status}, gap {100 * report.solver.gap:.1f}%",
    )


def _uniform_fallback(exc: onnx_remat.InfeasibleBudgetError, budget: str, keep_all: int) -> str:
    """With several devices, `min` would shrink one device after another (the last to what stays resident, as
    if it were not there); the table wants every device at one share of its keep-all instead: the smallest whole
    percentage at or above the minimum the error states (`keep_all`: the keep-all of the fullest device)."""
    percent = max(int(budget.rstrip("%")), math.ceil(100 * exc.minimum_bytes / keep_all))
    return f"{percent}%"


def parse_case(text: str) -> tuple[str, list[int]]:
    """`resnet18:2,4` -> ("resnet18", [2, 4])."""
    network, _, batches = text.partition(":")
    return network, [int(b) for b in batches.split(",")] if batches else [1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--cases",
        nargs="+",
        default=list(DEFAULT_CASES),
        metavar="NETWORK:N,N",
        help=f"networks and batch sizes (default {' '.join(DEFAULT_CASES)})",
    )
    parser.add_argument("--low", default="25%", help="the low budget of Table 2 (default 25%%)")
    parser.add_argument("--time-limit", type=float, default=20.0, help="solver seconds per budget (default 20)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per model, median (default 5)")
    parser.add_argument("--devices", metavar="FILE.toml|PRESET", help="place on these devices (default one CPU)")
    args = parser.parse_args()
    console = Console(width=160)
    where = "one CPU device" if args.devices is None else f"devices {args.devices}"
    table1 = Table(title=f"Table 1 shape: training step with sufficient budget (keep-all), {where}")
    table2 = Table(title=f"Table 2 shape: training step at full and {args.low} budget, overhead against full")
    for column in ("network", "N", "budget", "pred. time", "meas. time", "solver"):
        table1.add_column(column, justify="left" if column in ("network", "solver") else "right")
    for column in (
        "network",
        "N",
        "budget",
        "% keep-all",
        "pred. time",
        "meas. time",
        "pred. overhead",
        "meas. overhead",
        "recomputes",
        "solver",
    ):
        table2.add_column(column, justify="left" if column in ("network", "budget", "solver") else "right")
    for case in args.cases:
        network, batches = parse_case(case)
        for batch in batches:
            full = solve_and_measure(network, batch, "100%", args.time_limit, args.repeats, args.devices)
            low = solve_and_measure(
                network, batch, args.low, args.time_limit, args.repeats, args.devices, full.keep_all_bytes
            )
            table1.add_row(
                network,
                str(batch),
                format_bytes(full.budget_bytes),
                f"{1e3 * full.predicted_seconds:.2f} ms",
                f"{1e3 * full.measured_seconds:.2f} ms",
                full.status,
            )
            for run in (full, low):
                table2.add_row(
                    network,
                    str(batch),
                    f"{run.budget_label} = {format_bytes(run.budget_bytes)}",
                    f"{100 * run.budget_bytes / run.keep_all_bytes:.0f}%",
                    f"{1e3 * run.predicted_seconds:.2f} ms",
                    f"{1e3 * run.measured_seconds:.2f} ms",
                    f"{100 * (run.predicted_seconds / full.predicted_seconds - 1):+.1f}%",
                    f"{100 * (run.measured_seconds / full.measured_seconds - 1):+.1f}%",
                    str(run.recomputations),
                    run.status,
                )
            console.print(f"done: {network} N={batch}", highlight=False)
    console.print(table1)
    console.print(table2)


if __name__ == "__main__":
    main()
