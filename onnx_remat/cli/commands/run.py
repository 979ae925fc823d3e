"""`onnx-remat run OUT.onnx --devices FILE`: execute a rewritten model on its devices, report time and memory.

Each device runs its segments of the model in its own runtime, tensors handed across at the copy nodes
(onnx_remat.passes.run_devices). Prints the measured time per run (median of --repeats after a warm-up) in total,
per device and for the hand-offs, and each device's peak memory, predicted and measured (in a fresh process, the
high-water mark reset around every step: onnx_remat.passes.measure_devices), against its budget.

The peak a fresh process measures moves from one process to the next (by tens of KiB on small models, 0.1-1 MiB on
large ones), so the verdict rests on several when one is not clear: when the first process's peak lands within 2% of
a device's budget (1 MiB at least) or over it, --memory-processes processes in all measure it, and the line states
their median and range. A device is OVER BUDGET (exit 8) only when every process measured it over; when some
measured it within and some over, the budget lies within the measurement's spread, which the line says, and the run
succeeds (onnx_remat.passes.verdict). With --no-measure-memory the predicted peak alone is judged.
"""

from __future__ import annotations

import argparse
import io
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from rich.console import Console

from onnx_remat.cli.arguments import add_output_options
from onnx_remat.core.budget import format_bytes
from onnx_remat.core.devices import PRESETS
from onnx_remat.core.errors import OverBudgetError, UsageError
from onnx_remat.core.files import check_outputs, write_atomically
from onnx_remat.core.options import DEFAULT_MEMORY_PROCESSES, DEFAULT_REPEATS
from onnx_remat.passes.verdict import NEAR_BYTES, NEAR_SHARE, Verdict

if TYPE_CHECKING:
    import onnx

    from onnx_remat.passes.run_devices import DeviceRun


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnx-remat run",
        description="Execute a model written by onnx-remat on its devices: every device's segments in its "
        "runtime, tensors handed across at the copy nodes; print measured time and each device's peak memory, "
        "predicted and measured, against its budget.",
    )
    parser.add_argument("model", help="a model written by onnx-remat (every node tagged with its device)")
    parser.add_argument(
        "--devices", metavar="FILE.toml|PRESET", required=True,
        help=f"the devices the model was rewritten for: a device file or a preset ({', '.join(PRESETS)})",
    )
    parser.add_argument(
        "--budget", help="compare the peaks with these budgets in bytes: for every device (2GiB) or per device "
        "(cpu=2GiB,gpu=512MiB); default the budgets the model was rewritten for",
    )
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help=f"timed runs after a warm-up, median (default {DEFAULT_REPEATS})")
    parser.add_argument("--no-measure-memory", dest="measure_memory", action="store_false",
                        help="compare predicted peaks with the budgets, skipping the measurement (which runs the "
                        "model again in a fresh process)")
    parser.add_argument("--memory-processes", type=int, default=DEFAULT_MEMORY_PROCESSES, metavar="N",
                        help="fresh processes measuring the peaks when the first lands within "
                        f"{NEAR_SHARE * 100:.0f}%% of a budget ({format_bytes(NEAR_BYTES)} at least) or over it; a "
                        "device is over budget only if every one measured it over, and within the measurement's "
                        f"spread if only some did (default {DEFAULT_MEMORY_PROCESSES}; 1 trusts one process)")
    parser.add_argument("--inputs", metavar="FEEDS.npz", help="graph inputs by name (default: random values)")
    parser.add_argument("--outputs", metavar="OUT.npz", help="write the graph outputs by name")
    parser.add_argument("--check", action="store_true",
                        help="also run the whole model in onnxruntime on the CPU and print the largest difference")
    add_output_options(parser)
    return parser


def run(args: argparse.Namespace, console: Console) -> None:
    """Read the inputs, run the model on its devices, print the summary (lines unwrapped, so that a log holds each
    device's verdict on one line), write the outputs."""
    from onnx_remat.execution import input_values, run_on_devices
    from onnx_remat.passes.execute import run as run_whole
    from onnx_remat.passes.load import load_model

    if args.outputs:
        check_outputs([args.outputs], args.model, args.force)
    model = load_model(args.model)
    feeds = input_values(model, _read_feeds(args.inputs) if args.inputs else None)
    result = run_on_devices(model, args.devices, feeds, args.budget, args.repeats, args.measure_memory,
                            args.memory_processes)
    for line in summary_lines(args.model, result, args.repeats):
        console.print(line, highlight=False, soft_wrap=True)
    if args.check:
        whole = run_whole(model, feeds)
        worst = max(float(np.max(np.abs(got - want), initial=0.0))
                    for got, want in zip(result.outputs.values(), whole, strict=True))
        console.print(f"largest difference to the whole model in onnxruntime: {worst:.3g}{_random_note(model)}"
                      f"{_race_note(model)}",
                      highlight=False, soft_wrap=True)
    if args.outputs:
        buffer = io.BytesIO()
        np.savez(buffer, **result.outputs)  # type: ignore[arg-type]  # numpy's stubs match **kwds to allow_pickle
        write_atomically(Path(args.outputs), buffer.getvalue())
    if over := [name for name, verdict in result.verdicts.items() if verdict is Verdict.OVER]:
        how = "predicted" if result.measured_peak_samples is None else "measured in every process"
        raise OverBudgetError(f"{', '.join(over)} went over budget ({how}): raise the budget, or rewrite with "
                              "--headroom for what the runtime allocates beyond the tensors")


def _random_note(model: onnx.ModelProto) -> str:
    """Why the outputs of a model that draws random values (Dropout in training mode) cannot match its whole run's."""
    import onnx_ir as ir

    from onnx_remat.passes.random_ops import draws_random

    drawing = [node for node in ir.from_proto(model).graph if draws_random(node)]
    if not drawing:
        return ""
    first = drawing[0]
    count = f"{len(drawing)} nodes" if len(drawing) > 1 else "1 node"
    return (f" (the model draws random values in {count}, the first {first.name!r} ({first.op_type}): "
            "two runs differ whatever the rewrite, so this difference says nothing of it)")


def _race_note(model: onnx.ModelProto) -> str:
    """Why a model's outputs may differ from its whole run's where onnxruntime runs a node racily (ScatterND adding)."""
    from onnx_remat.passes.execute import adds_unsynchronised

    racing = [node for node in model.graph.node if adds_unsynchronised(node)]
    if not racing:
        return ""
    first = racing[0]
    count = f"{len(racing)} nodes" if len(racing) > 1 else "1 node"
    return (f" (the model adds with ScatterND in {count}, the first {first.name!r}: onnxruntime's CPU kernel adds its "
            "rows on several threads unsynchronised and can lose an update where two rows name one slice "
            "(microsoft/onnxruntime#18048), so two runs can differ whatever the rewrite)")


def _read_feeds(path: str) -> dict[str, np.ndarray]:
    """The arrays of an .npz file by name."""
    if not Path(path).is_file():
        raise UsageError(f"--inputs {path} does not exist: give an .npz file with one array per graph input")
    try:
        with np.load(path) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise UsageError(f"--inputs {path} is not an .npz file ({exc})") from None


def summary_lines(model: str, result: DeviceRun, repeats: int) -> list[str]:
    """Time per run in total, per device and for hand-offs; each device's peaks against its budget (the verdict on
    the measured peaks if measured, their median and range, else on the predicted)."""
    lines = [
        f"ran {model} on {' + '.join(result.device_seconds)}: {sum(result.segments.values())} segments, "
        f"{result.copies} copies; {_ms(result.seconds)} per run (median of {repeats})",
    ]
    verdicts = result.verdicts
    for name, seconds in result.device_seconds.items():
        budget = result.budgets[name]
        against = "no budget" if budget is None else f"budget {format_bytes(budget, 2)}, {verdicts[name].value}"
        measured = "" if result.measured_peak_samples is None else _measured(result.measured_peak_samples[name])
        lines.append(
            f"  {name}: {result.segments[name]} segments, {_ms(seconds)}, predicted peak "
            f"{format_bytes(result.predicted_peak_bytes[name], 2)}{measured} ({against})"
        )
    if len(result.device_seconds) > 1:
        lines.append(f"  hand-offs between devices: {_ms(result.handoff_seconds)}")
    return lines


def _measured(peaks: tuple[int, ...]) -> str:
    """The measured peak's median, and its range over the processes if more than one measured it."""
    if len(peaks) == 1:
        return f", measured peak {format_bytes(peaks[0], 2)} (1 fresh process)"
    return (f", measured peak {format_bytes(statistics.median(peaks), 2)} ({format_bytes(min(peaks), 2)} to "
            f"{format_bytes(max(peaks), 2)} over {len(peaks)} fresh processes)")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"
