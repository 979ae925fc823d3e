"""`onnx-remat max-batch IN.onnx --budget 4GiB`: the largest batch size whose rematerialized model fits."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from onnx_remat.cli.arguments import (
    add_input_shape_option,
    add_mode_options,
    add_output_options,
    add_solver_options,
    remat_options,
)
from onnx_remat.core.budget import format_bytes, parse_budget
from onnx_remat.core.errors import InfeasibleBudgetError, UsageError
from onnx_remat.core.files import check_outputs, write_atomically
from onnx_remat.core.options import DEFAULT_MAX_BATCH, DEFAULT_POINT_TIME_LIMIT

if TYPE_CHECKING:
    from onnx_remat.batch import BatchTrial, MaxBatch

TABLE_WIDTH = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnx-remat max-batch",
        description="Find the largest batch size whose rematerialized model fits the budget: doubling, then "
        "bisection. The model's batch dimension (first dimension of its inputs) must be symbolic.",
    )
    parser.add_argument("input", help="the ONNX model, with a symbolic batch dimension")
    parser.add_argument("--budget", required=True, help="memory budget in bytes with an optional unit (4GiB)")
    add_mode_options(parser)
    add_input_shape_option(parser, "fix an input's other symbolic dimensions; its first dimension is the batch to "
                           "start from (repeatable)")
    parser.add_argument(
        "--max-batch",
        type=int,
        default=DEFAULT_MAX_BATCH,
        metavar="N",
        help=f"largest batch to try (default {DEFAULT_MAX_BATCH})",
    )
    add_solver_options(parser, DEFAULT_POINT_TIME_LIMIT, "seconds each batch tried may take")
    parser.add_argument("-o", "--output", metavar="OUT.onnx", help="write the rewritten model at the largest batch")
    parser.add_argument("--report", metavar="FILE.json", help="write the report of the largest batch as JSON")
    add_output_options(parser)
    return parser


def run(args: argparse.Namespace, console: Console) -> None:
    """Search the batch, print every batch tried and the result, write model and report if asked."""
    from onnx_remat.batch import max_batch

    budget = parse_budget(args.budget)
    if budget.absolute_bytes is None:
        raise UsageError(
            f"--budget {args.budget}: max-batch needs bytes (4GiB); a percentage of keep-all or min changes "
            "with the batch"
        )
    if args.max_batch < 1:
        raise UsageError("--max-batch must be at least 1")
    check_outputs([extra for extra in (args.output, args.report) if extra], args.input, args.force)
    options = remat_options(args)
    with console.status("trying batch sizes", spinner="dots") as status:

        def show(trial: BatchTrial) -> None:
            verdict = "fits" if trial.fits else f"does not fit ({trial.status})"
            console.print(f"batch {trial.batch}: {verdict}", highlight=False)
            status.update(f"batch {trial.batch} {verdict}; trying the next")

        found = max_batch(args.input, budget.absolute_bytes, options, limit=args.max_batch, on_trial=show)
    if not console.is_terminal:
        console.width = max(console.width, TABLE_WIDTH)  # a log or pipe: keep rows on one line
    console.print(table(found, budget.absolute_bytes))
    if found.result is None:
        smallest = min(found.trials, key=lambda t: t.batch)
        needs = f" (it needs at least {format_bytes(smallest.minimum_bytes)})" if smallest.minimum_bytes else ""
        raise InfeasibleBudgetError(
            f"no batch fits {format_bytes(budget.absolute_bytes)}: batch {smallest.batch} does not{needs}; "
            "raise --budget",
            smallest.minimum_bytes,
        )
    console.print(result_line(found, budget.absolute_bytes, args.max_batch), highlight=False)
    if args.output:
        found.result.save(args.output, force=args.force)
        console.print(f"wrote {args.output} (batch {found.batch})", highlight=False)
    if args.report:
        write_atomically(Path(args.report), found.result.report.to_json().encode())


def table(found: MaxBatch, budget_bytes: int) -> Table:
    """Every batch tried, in order: fits or not, minimum budget, predicted peak, time and recomputations."""
    out = Table(title=f"batch sizes tried against {format_bytes(budget_bytes)}")
    for column in ("batch", "fits", "minimum", "pred. peak", "pred. time", "per sample", "recomputes", "solver"):
        out.add_column(column, justify="left" if column in ("fits", "solver") else "right")
    for t in found.trials:
        minimum = format_bytes(t.minimum_bytes) if t.minimum_bytes is not None else "-"
        if not t.fits or t.predicted_peak_bytes is None or t.predicted_seconds is None:
            out.add_row(str(t.batch), "yes" if t.fits else "no", minimum, "-", "-", "-", "-", t.status)
            continue
        out.add_row(
            str(t.batch),
            "yes",
            minimum,
            format_bytes(t.predicted_peak_bytes),
            f"{1e3 * t.predicted_seconds:.2f} ms",
            f"{1e3 * t.predicted_seconds / t.batch:.3f} ms",
            str(t.recomputations),
            t.status,
        )
    return out


def result_line(found: MaxBatch, budget_bytes: int, limit: int) -> str:
    """The answer in one sentence."""
    capped = " (the --max-batch limit; larger ones were not tried)" if found.batch == limit else ""
    return f"largest batch within {format_bytes(budget_bytes)}: {found.batch}{capped}"
