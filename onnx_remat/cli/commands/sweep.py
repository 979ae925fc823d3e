"""`onnx-remat sweep IN.onnx --budgets 100%,75%,50%,25%`: predicted (and measured) time against budget, the knee."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from onnx_remat.cli.arguments import (
    add_device_options,
    add_input_shape_option,
    add_mode_options,
    add_output_options,
    add_solver_options,
    remat_options,
)
from onnx_remat.core.budget import format_bytes
from onnx_remat.core.errors import UsageError
from onnx_remat.core.files import check_outputs, write_atomically
from onnx_remat.core.options import DEFAULT_BUDGETS, DEFAULT_KNEE_OVERHEAD, DEFAULT_POINT_TIME_LIMIT

if TYPE_CHECKING:
    from onnx_remat.sweep import Sweep

TABLE_WIDTH = 170


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnx-remat sweep",
        description="Solve a model at several budgets; print time, overhead, recomputations and peak per budget. "
        "The knee is the smallest budget whose predicted time is within --knee-overhead of keep-all.",
    )
    parser.add_argument("input", help="the ONNX model")
    parser.add_argument(
        "--budgets",
        default=DEFAULT_BUDGETS,
        help=f"comma-separated budgets, each as --budget takes it (default {DEFAULT_BUDGETS.replace('%', '%%')})",
    )
    add_mode_options(parser)
    add_input_shape_option(parser)
    add_solver_options(parser, DEFAULT_POINT_TIME_LIMIT, "seconds each budget may take")
    add_device_options(parser, "each budget then applies to every device")
    parser.add_argument(
        "--measure",
        action="store_true",
        help="also run each rewritten model: in onnxruntime (one device) the measured activation peak and time; "
        "on several devices each device's segments on its runtime, the measured time and per-device peaks",
    )
    parser.add_argument(
        "--knee-overhead",
        type=float,
        default=100 * DEFAULT_KNEE_OVERHEAD,
        metavar="PERCENT",
        help=f"overhead defining the knee (default {100 * DEFAULT_KNEE_OVERHEAD:g}%%)",
    )
    parser.add_argument("--plot", metavar="FILE.png|svg", help="draw time and peak against budget, knee marked")
    parser.add_argument("--json", metavar="FILE.json", help="write every point of the sweep as JSON")
    add_output_options(parser)
    return parser


def run(args: argparse.Namespace, console: Console) -> None:
    """Check the outputs can be written, sweep, print the table, write plot and JSON."""
    from onnx_remat.plot import plot_sweep
    from onnx_remat.sweep import parse_budgets, sweep

    if args.knee_overhead < 0:
        raise UsageError("--knee-overhead must be a percentage of at least 0")
    if args.plot and Path(args.plot).suffix.lower() not in (".png", ".svg"):
        raise UsageError(f"--plot {args.plot} must end in .png or .svg")
    check_outputs([extra for extra in (args.plot, args.json) if extra], args.input, args.force)
    budgets = parse_budgets(args.budgets)
    options = remat_options(args)
    with console.status(f"solving at {len(budgets)} budgets", spinner="dots"):
        result = sweep(args.input, budgets, options, measure=args.measure, knee_overhead=args.knee_overhead / 100)
    if not console.is_terminal:
        console.width = max(console.width, TABLE_WIDTH)  # a log or pipe: keep rows on one line
    console.print(table(result))
    console.print(knee_line(result), highlight=False)
    console.print(f"costs: {result.cost_model}, {result.cost_source}", highlight=False)
    if args.json:
        write_atomically(Path(args.json), to_json(result).encode())
    if args.plot:
        plot_sweep(result, args.plot)


def table(result: Sweep) -> Table:
    """The sweep as a rich table, one row per budget, largest first."""
    measured = any(p.measured_seconds is not None for p in result.points)
    devices = [name for name, _ in next((p.device_peak_bytes for p in result.points if p.feasible), ())]
    several = len(devices) > 1
    out = Table(title=f"{result.model} ({result.mode}) against budget")
    columns = ["budget", "bytes", "pred. time", "overhead", "recomputes", "pred. peak", "solver"]
    columns += ["copies", *(f"peak {name}" for name in devices)] if several else []
    if measured and several:
        columns += ["meas. time", *(f"meas. peak {name}" for name in devices)]
    elif measured:
        columns += ["meas. activations", "pred. activations", "meas. time"]
    for column in columns:
        out.add_column(column, justify="left" if column in ("budget", "solver") else "right")
    for i, p in enumerate(result.points):
        label = p.label + (" (knee)" if i == result.knee else "")
        size = _bytes(p.budget_bytes)
        if not p.feasible:
            minimum = _bytes(p.minimum_bytes)
            out.add_row(label, size, "-", "-", "-", "-", f"infeasible: minimum {minimum}", *["-"] * (len(columns) - 7))
            continue
        activations = (
            None if p.predicted_peak_bytes is None or p.resident_bytes is None
            else p.predicted_peak_bytes - p.resident_bytes
        )
        row = [
            label,
            size,
            _milliseconds(p.predicted_seconds),
            _percent(p.overhead, "+.1f"),
            str(p.recomputations),
            _bytes(p.predicted_peak_bytes),
            f"{p.status}, gap {_percent(p.gap, '.1f')}",
        ]
        if several:
            row += [str(p.copies), *(format_bytes(peak) for _, peak in p.device_peak_bytes)]
        if measured and several:
            peaks = [format_bytes(peak) for _, peak in p.measured_device_peak_bytes]
            row += [_milliseconds(p.measured_seconds), *peaks]
        elif measured:
            row += [_bytes(p.measured_activation_bytes), _bytes(activations), _milliseconds(p.measured_seconds)]
        out.add_row(*row)
    return out


def _milliseconds(seconds: float | None) -> str:
    """A table cell: milliseconds, or "?" if not known."""
    return "?" if seconds is None else f"{1e3 * seconds:.3f} ms"


def _percent(fraction: float | None, spec: str) -> str:
    """A table cell: a percentage in format `spec`, or "?" if not known."""
    return "?" if fraction is None else f"{100 * fraction:{spec}}%"


def _bytes(count: int | None) -> str:
    """A table cell: a byte count, or "?" if not known."""
    return "?" if count is None else format_bytes(count)


def knee_line(result: Sweep) -> str:
    """One sentence naming the knee, or saying there is none within the overhead."""
    limit = f"{100 * result.knee_overhead:g}%"
    if result.knee is None:
        return f"knee: no feasible budget has a predicted overhead within {limit}"
    p = result.points[result.knee]
    return (
        f"knee: {p.label} = {_bytes(p.budget_bytes)}, the smallest budget within {limit} of keep-all time "
        f"({_percent(p.overhead, '+.1f')})"
    )


def to_json(result: Sweep) -> str:
    """The sweep as JSON: every point with its overhead, the knee's budget and the overhead that defines it."""
    points = [dict(asdict(p), overhead=p.overhead) for p in result.points]
    knee = None if result.knee is None else result.points[result.knee].label
    data = {"model": result.model, "mode": result.mode, "knee": knee, "knee_overhead": result.knee_overhead,
            "cost_model": result.cost_model, "cost_source": result.cost_source}
    return json.dumps(dict(data, points=points), indent=2)
