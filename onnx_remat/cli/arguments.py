"""Argument types and option groups shared by the commands' parsers, so every command takes an option the same way."""

from __future__ import annotations

import argparse
import difflib
import math
import re
from collections.abc import Iterable
from pathlib import Path

from onnx_remat.core.devices import PRESETS
from onnx_remat.core.errors import UsageError
from onnx_remat.core.options import COST_MODELS, LOSSES, MODES, SOLVERS, RematOptions, TrainingOptions

LONGEST_SECONDS = 7 * 24 * 3600.0
"""A week: longer limits overflow the solvers' and timers' clocks."""


def seconds(text: str) -> float:
    """A time limit: a finite number of seconds above zero and at most a week."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= LONGEST_SECONDS):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0 and at most {LONGEST_SECONDS:g}")
    return value


NEGATIVE_VALUE = re.compile(r"-[\d.]")


def join_negative_values(argv: list[str]) -> list[str]:
    """`--budget -5%` as `--budget=-5%`: argparse takes a value starting with '-' for an option and says only
    "expected one argument"; joined, the value reaches its own check and that check's message."""
    joined: list[str] = []
    for token in argv:
        if joined and NEGATIVE_VALUE.match(token) and joined[-1].startswith("--") and "=" not in joined[-1]:
            joined[-1] = f"{joined[-1]}={token}"
        else:
            joined.append(token)
    return joined


def check_not_mistyped_command(first: str, commands: Iterable[str]) -> None:
    """Refuse a first argument that is no file but close to a command's name (`swep`), which would otherwise be
    read as the input model."""
    if Path(first).exists() or first.startswith("-"):
        return
    close = difflib.get_close_matches(first, list(commands), n=1, cutoff=0.6)
    if close:
        raise UsageError(f"no command or file {first!r}: did you mean `onnx-remat {close[0]} ...`?")


def solver_name(text: str) -> str:
    """A --solver value: a backend's name or auto."""
    if text not in SOLVERS:
        raise argparse.ArgumentTypeError(f"unknown solver {text!r}: choose one of {', '.join(SOLVERS)}")
    return text


def add_mode_options(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """--mode and the options that turn a model into its train step, the same for every command that rewrites;
    returns the train-mode group for a command's own train options."""
    parser.add_argument("--mode", choices=MODES, default="infer", help="infer (default) or train")
    train = parser.add_argument_group("train mode")
    train.add_argument("--loss", choices=LOSSES, default="mse", help="loss on the model's first output (default mse)")
    train.add_argument("--freeze", action="append", default=[], metavar="PATTERN",
                       help="exclude parameters matching this glob pattern from training (repeatable)")
    train.add_argument("--optimizer", choices=("sgd",), default=None, help="put the update step in the graph")
    train.add_argument("--lr", type=float, default=0.01, help="learning rate of --optimizer (default 0.01)")
    return train


def training_options(args: argparse.Namespace) -> TrainingOptions:
    """The train-step options add_mode_options parsed."""
    return TrainingOptions(args.loss, tuple(args.freeze), args.optimizer, args.lr)


def remat_options(args: argparse.Namespace) -> RematOptions:
    """The RematOptions of the shared option groups a command's parser has: mode and train step, input shapes,
    solver and time limit, and devices and cost model where it takes them."""
    return RematOptions(
        mode=args.mode,
        training=training_options(args),
        input_shapes=parse_input_shapes(args.input_shape),
        solver=args.solver,
        time_limit=args.time_limit,
        devices=getattr(args, "devices", None),
        cost_model=getattr(args, "cost_model", None),
    )


def add_solver_options(parser: argparse.ArgumentParser, time_limit: float, time_limit_help: str) -> None:
    """--solver and --time-limit (whose default and meaning differ by command)."""
    parser.add_argument("--solver", type=solver_name, default="auto",
                        help=f"solver backend: {', '.join(SOLVERS)} (default auto)")
    parser.add_argument("--time-limit", type=seconds, default=time_limit, metavar="SECONDS",
                        help=f"{time_limit_help} (default {time_limit:g})")


def add_device_options(parser: argparse.ArgumentParser, budgets_help: str) -> None:
    """--devices and --cost-model."""
    parser.add_argument("--devices", metavar="FILE.toml|PRESET",
                        help=f"the devices to place operators on: a device file or a preset ({', '.join(PRESETS)}); "
                        f"default one onnxruntime CPU device; {budgets_help}")
    parser.add_argument("--cost-model", choices=COST_MODELS,
                        help="operator costs: analytic (roofline), profiled (each operator timed alone on every "
                        "device) or in-graph (timed inside whole-model runs on every device); measured costs are "
                        "cached; default this machine's own: in-graph with one device, profiled with several, the "
                        "roofline where measuring fails (the summary says which)")


def add_input_shape_option(parser: argparse.ArgumentParser,
                           help: str = "fix a graph input's shape, e.g. input=1x3x224x224 (repeatable)") -> None:
    """--input-shape NAME=DxDx..., repeatable."""
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME=DxDx...", help=help)


LARGEST_DIMENSION = 2**62
"""Dimensions are int64 in ONNX; beyond this one no tensor could exist anyway."""


def parse_input_shapes(values: list[str]) -> dict[str, tuple[int, ...]]:
    """Parse repeated NAME=1x3x224x224 options."""
    shapes = {}
    for value in values:
        name, _, dims = value.partition("=")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            shape = ()
        if not name or not shape or any(not 0 < d < LARGEST_DIMENSION for d in shape):
            raise UsageError(f"cannot read --input-shape {value!r}: write NAME=1x3x224x224 with positive sizes "
                             f"below {LARGEST_DIMENSION}")
        shapes[name] = shape
    return shapes


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """-q and --force."""
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    parser.add_argument("--force", action="store_true", help="overwrite existing output files")
