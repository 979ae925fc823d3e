"""Command line: `onnx-remat IN.onnx OUT.onnx --budget B`, a thin layer over `onnx_remat.remat`, and
subcommands (`onnx-remat COMMAND ...`), each a module in `onnx_remat.cli.commands` registered in COMMANDS.

A command module has `build_parser() -> argparse.ArgumentParser` and `run(args, console) -> None`. Parsers take
their choices from onnx_remat.core.options; the pipeline, runtimes and solvers load in `run`, so --help is quick.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress

from onnx_remat.cli.arguments import (
    add_device_options,
    add_input_shape_option,
    add_mode_options,
    add_output_options,
    add_solver_options,
    check_not_mistyped_command,
    join_negative_values,
    remat_options,
)
from onnx_remat.cli.signals import INTERRUPTED_CODE, INTERRUPTED_MESSAGE, Terminated, terminated_on_signals
from onnx_remat.core.budget import format_bytes
from onnx_remat.core.errors import RematError, RematWarning, UsageError
from onnx_remat.core.files import check_outputs, write_together
from onnx_remat.core.options import DEFAULT_TIME_LIMIT

if TYPE_CHECKING:
    import onnx

    from onnx_remat.pipeline import RematResult

COMMANDS: dict[str, str] = {
    "sweep": "sweep",
    "max-batch": "max_batch",
    "solve": "solve",
    "run": "run",
}
"""Subcommand name -> the module in onnx_remat.cli.commands that implements it."""

EXIT_CODES = """exit codes:
  0  success
  1  internal error (a bug: please report it)
  2  bad arguments (budget, input shape, solver, mode)
  3  unusable input model (missing, not ONNX, truncated, fails the checker, symbolic shapes)
  4  budget below the minimum feasible budget (the message states the minimum)
  5  output cannot be written (exists without --force, same as input, missing directory)
  6  the solver found no schedule in the time limit
  7  a schedule failed the simulator (a bug: please report it)
  8  onnx-remat run measured a device over its budget in every fresh process
  130 interrupted (Ctrl-C); 143 and 129 stopped by SIGTERM and SIGHUP"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnx-remat",
        description="Rewrite an ONNX model so that it runs within a memory budget, recomputing what it must.",
        epilog=_commands_help() + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("input", help="the ONNX model to rewrite")
    parser.add_argument("output", help="where to write the rewritten ONNX model")
    parser.add_argument(
        "--budget",
        help="memory budget: bytes with an optional unit (512MiB, 1.5GB, 1073741824), "
        "a percentage of keep-all (25%%), or min; for every device, or per device as cpu=2GiB,gpu=25%%",
    )
    add_device_options(parser, "with several, --budget is for all or per device")
    add_mode_options(parser).add_argument(
        "--no-remat", action="store_true", help="write the training graph as it is, without scheduling or rewriting it")
    add_input_shape_option(parser)
    add_solver_options(parser, DEFAULT_TIME_LIMIT, "the whole command's time; the solver stops then with the best "
                       "schedule found")
    parser.add_argument("--report", metavar="FILE.json", help="write the full report as JSON")
    parser.add_argument("--emit-problem", metavar="FILE.json",
                        help="write the solver's problem as JSON before solving (onnx-remat solve reads it)")
    parser.add_argument("--emit-mps", metavar="FILE.mps", help="write the solver's MILP as MPS before solving")
    parser.add_argument(
        "--headroom", type=_percent, default=0.0, metavar="PCT",
        help="leave this share of every budget free for what runtimes allocate beyond the tensors, e.g. 3%% "
        "(default 0)",
    )
    parser.add_argument(
        "--pick-by-running", action="store_true",
        help="with several devices: run the solver's schedule and each device's best schedule alone on the devices "
        "and keep the fastest (the times in the summary)",
    )
    parser.add_argument("--plot", metavar="FILE.png|svg",
                        help="draw the compute and keep matrices and memory over time per device")
    parser.add_argument("--netron-attachment", nargs="?", const="", metavar="FILE.json",
                        help="write a Netron attachment (per-node plan in Netron's sidebar); "
                        "without FILE beside the output as OUT.netron.json")
    add_output_options(parser)
    return parser


def _commands_help() -> str:
    """The epilog lines naming the subcommands, if any are registered."""
    if not COMMANDS:
        return ""
    names = ", ".join(sorted(COMMANDS))
    return f"other commands: {names} (onnx-remat COMMAND --help)\n\n"


def command_module(name: str) -> ModuleType:
    """The module implementing subcommand `name`."""
    return importlib.import_module(f"onnx_remat.cli.commands.{COMMANDS[name]}")


def _percent(text: str) -> float:
    """A percentage such as 3% (or 3) as a fraction in [0, 1)."""
    try:
        value = float(text.strip().removesuffix("%")) / 100
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage from 0% to below 100%")
    return value


def run(args: argparse.Namespace, console: Console) -> None:
    """Check the outputs can be written, run the pipeline, write model and report."""
    from onnx_remat.netron import default_path
    from onnx_remat.passes.model_files import data_file, has_external_data
    from onnx_remat.pipeline import prepare, remat

    options = remat_options(args)
    if args.no_remat and args.mode != "train":
        raise UsageError("--no-remat writes the training graph: use it with --mode train")
    if args.budget is None and args.devices is None and not args.no_remat:
        raise UsageError("--budget is required: give bytes (512MiB), a percentage of keep-all (25%) or min")
    if args.netron_attachment == "":
        args.netron_attachment = str(default_path(args.output))
    if args.netron_attachment and not args.netron_attachment.lower().endswith(".json"):
        raise UsageError(f"--netron-attachment {args.netron_attachment} must end in .json (Netron reads only those)")
    extras = (args.report, args.plot, args.netron_attachment, args.emit_problem, args.emit_mps)
    weights = [data_file(args.output)] if has_external_data(args.input) else []
    check_outputs([args.output, *weights, *(extra for extra in extras if extra)], args.input, args.force)
    if args.emit_mps and Path(args.emit_mps).suffix.lower() != ".mps":
        raise UsageError(f"--emit-mps {args.emit_mps} must end in .mps")
    if args.plot and Path(args.plot).suffix.lower() not in (".png", ".svg"):
        raise UsageError(f"--plot {args.plot} must end in .png or .svg")
    if args.no_remat:
        model = prepare(args.input, "train", options.input_shapes, options.training).proto
        write_together(_model_files(args, model, bool(weights)))
        console.print(f"wrote the training graph ({len(model.graph.node)} nodes) to {args.output}", highlight=False)
        return
    with _live_progress(console) as (on_profile, on_solve):
        result = remat(
            args.input, args.budget, options, progress=on_solve, profile_progress=on_profile,
            emit_problem=args.emit_problem, emit_mps=args.emit_mps, pick_by_running=args.pick_by_running,
            headroom=args.headroom, find_minimum=bool(args.report), plot=bool(args.plot), started=args.started,
        )
    summary = result.report.summary()
    write_together(_outputs(args, result))
    console.print(summary, highlight=False)
    console.print(f"wrote {args.output}", highlight=False)


def _model_files(args: argparse.Namespace, model: onnx.ModelProto, external: bool) -> dict[Path, bytes]:
    """The output model's file, with its weights in `<output>.data` beside it when the input kept them outside
    (that path was checked before the work) or the model is too large for one file (checked now)."""
    from onnx_remat.passes.model_files import model_files

    files = model_files(model, args.output, external)
    check_outputs([path for path in files if path != Path(args.output)], args.input, args.force)
    return files


def _outputs(args: argparse.Namespace, result: RematResult) -> dict[Path, bytes]:
    """Every file the main command writes, by path, rendered before any is written."""
    from onnx_remat.netron import attachment_bytes

    outputs = _model_files(args, result.model, result.external_data)
    if args.report:
        outputs[Path(args.report)] = result.report.to_json().encode()
    if args.netron_attachment:
        outputs[Path(args.netron_attachment)] = attachment_bytes(result.model, result.problem, result.schedule,
                                                                 result.report)
    if args.plot:
        from onnx_remat.plot import render_schedule  # matplotlib's import takes 1 s on an idle core: only for a plot

        outputs[Path(args.plot)] = render_schedule(
            result.problem, result.schedule, Path(args.plot).suffix, forward_count=result.forward_count,
            title=f"{Path(args.input).name} at {format_bytes(result.report.budget_bytes)}")
    return outputs


@contextmanager
def _live_progress(
    console: Console,
) -> Iterator[tuple[Callable[[int, int, str], None], Callable[[float, float | None, float | None], None]]]:
    """Progress callbacks for profiling (a bar over the measurements) and solving (incumbent and bound), shown on a
    terminal only: on a pipe or a log file the stopped display left an empty line before the summary or the error."""
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with RichProgress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar:
        solving = bar.add_task("preparing", total=None)
        profiling: list[TaskID] = []

        def on_profile(done: int, total: int, label: str) -> None:
            if not profiling:
                profiling.append(bar.add_task("profiling", total=total))
            bar.update(profiling[0], completed=done, description=f"profiling {label}")

        def on_solve(elapsed: float, incumbent: float | None, bound: float | None) -> None:
            best = "-" if incumbent is None else f"{incumbent * 1e3:.3f} ms"
            low = "-" if bound is None else f"{bound * 1e3:.3f} ms"
            bar.update(solving, description=f"solving: {elapsed:.1f} s, incumbent {best}, bound {low}")

        yield on_profile, on_solve


@contextmanager
def _one_line_warnings() -> Iterator[None]:
    """Print the tool's own warnings as `onnx-remat: warning: ...` lines (others as Python prints them)."""
    with warnings.catch_warnings():
        python_style = warnings.showwarning

        def show(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: TextIO | None = None,
            line: str | None = None,
        ) -> None:
            if issubclass(category, RematWarning):
                print(f"onnx-remat: warning: {message}", file=sys.stderr)
            else:
                python_style(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


def main(argv: list[str] | None = None, started: float | None = None) -> int:
    """Run the command `argv` names; its time limit counts from `started` (perf_counter; default now), which the
    console entry sets before importing the runtimes so that their import counts too."""
    argv = join_negative_values(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        module = command_module(argv[0])
        args, action = module.build_parser().parse_args(argv[1:]), module.run
    else:
        try:
            check_not_mistyped_command(argv[0] if argv else "-", COMMANDS)
        except UsageError as exc:
            print(f"onnx-remat: error: {exc}", file=sys.stderr)
            return exc.exit_code
        args, action = build_parser().parse_args(argv), run
    args.started = time.perf_counter() if started is None else started
    console = Console(stderr=True, quiet=getattr(args, "quiet", False))
    try:
        with terminated_on_signals(), _one_line_warnings():
            action(args, console)
    except RematError as exc:
        print(f"onnx-remat: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(INTERRUPTED_MESSAGE, file=sys.stderr)
        return INTERRUPTED_CODE
    except Terminated as stop:
        print(stop.message, file=sys.stderr)
        return stop.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
