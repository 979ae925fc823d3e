"""Hugging Face transformers models' training steps against PyTorch autograd, per exporter.

For each model of tools/hf_models.py and each of PyTorch's exporters: build the training step (mse loss against a
seeded label, the module's float buffers frozen, as tools/real_models.py does), run it in onnxruntime and compare
its loss and every gradient with autograd on the same module and inputs in float64 (the step itself in float64,
by onnx's reference runtime, where PyTorch's own float32 error says float32 is ill-conditioned); then rewrite the
step at its minimum budget and compare it with the step as built. Prints a markdown table; a failure is the tool's
own message (or the exception's type and first line).

    python tools/hf_grads.py [--models deberta_v2,bloom] [--exporters dynamo,legacy] [--time-limit 30]
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from hf_models import _models, export, module
from real_models import (
    GRAD_PREFIX,
    Outcome,
    autograd_step,
    float64_step_outputs,
    frozen_in,
    gradient_errors,
    recomputes,
    relative_difference,
    rewritten_step,
    run,
)

from onnx_remat.core.options import TrainingOptions
from onnx_remat.pipeline import prepare

LOSS = "mse"


def training_feeds(inputs: dict[str, torch.Tensor], step_label: tuple[int, ...]) -> dict[str, np.ndarray]:
    """The model's example inputs by name and a seeded float label of the shape the step declares."""
    label = np.random.default_rng(2).standard_normal(step_label).astype(np.float32)
    return {**{k: v.numpy() for k, v in inputs.items()}, "label": label}


def check(name: str, exporter: str, folder: Path, time_limit: float) -> Outcome:
    """Export `name`, build its training step, compare with autograd, rewrite at the minimum, compare with itself."""
    outcome = Outcome(name, exporter)
    path = folder / f"{name}_{exporter}.onnx"
    failed = export(name, exporter, path, training=True)
    if failed:
        outcome.errors.append(f"export failed: {failed}")
        return outcome
    try:
        compare(name, path, outcome, time_limit)
    except Exception as error:  # noqa: BLE001  # every failure, the tool's own or a traceback, is a row
        outcome.errors.append(f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}")
    return outcome


@dataclass
class BuiltStep:
    """A training step as built, with the options and feeds it was built and run with, and its outputs."""
    options: TrainingOptions
    feeds: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]


def check_built_step(build: Callable[[], tuple[torch.nn.Module, dict[str, torch.Tensor]]], path: Path,
                     outcome: Outcome) -> BuiltStep:
    """Fill `outcome` with the training step of the exported `path` against autograd in float64 on the module
    `build` makes (with its named example inputs): loss and every gradient, PyTorch's own float32 error, parameters
    the step gives no gradient; the step built in float64 where float32 exceeds what `outcome` allows."""
    model, inputs = build()
    options = TrainingOptions(loss=LOSS, freeze=frozen_in(model, path))
    step = prepare(path, mode="train", training=options).proto
    label = next(i for i in step.graph.input if i.name == "label")
    feeds = training_feeds(inputs, tuple(d.dim_value for d in label.type.tensor_type.shape.dim))
    built = run(step, feeds)
    loss, grads = autograd_step(model, list(inputs.values()), LOSS, feeds["label"], torch.float64)
    errors = gradient_errors(built, loss, grads)
    outcome.gradient_error = max(errors)
    outcome.gradients_compared = len(errors) - 1
    outcome.gradients_written = sum(k.startswith(GRAD_PREFIX) for k in built)
    unwritten = unwritten_gradients(model, built)
    if unwritten:
        outcome.errors.append(f"{len(unwritten)} parameters with a gradient in autograd have none in the step "
                              f"(first: {unwritten[0]})")
    model32, _ = build()
    torch_loss, torch_grads = autograd_step(model32, list(inputs.values()), LOSS, feeds["label"], torch.float32)
    outcome.torch_float32_error = max(gradient_errors(
        {"loss": np.array(torch_loss), **{GRAD_PREFIX + k: v for k, v in torch_grads.items()}}, loss, grads))
    if outcome.gradient_error > outcome.allowed_gradient_error():
        outcome.gradient_error = max(gradient_errors(float64_step_outputs(path, options, feeds), loss, grads))
        outcome.gradient_precision = "float64"
    return BuiltStep(options, feeds, built)


def compare(name: str, path: Path, outcome: Outcome, time_limit: float) -> None:
    """The checks of `check` on the exported `path`, filling `outcome`."""
    step = check_built_step(lambda: module(name), path, outcome)
    result, outcome.train_budget = rewritten_step(path, step.options, "min", time_limit)
    outcome.train_recomputes = recomputes(result.model)
    rewritten = run(result.model, step.feeds)
    outcome.train_difference = max(relative_difference(rewritten[k], v) for k, v in step.outputs.items())


def unwritten_gradients(model: torch.nn.Module, built: dict[str, np.ndarray]) -> list[str]:
    """The parameters autograd gave a gradient whose gradient the step writes under none of their names (a tied one
    has several)."""
    names: dict[int, list[str]] = {}
    for key, parameter in model.named_parameters(remove_duplicate=False):
        if parameter.grad is not None:
            names.setdefault(id(parameter), []).append(key)
    return [keys[0] for keys in names.values() if not any(GRAD_PREFIX + key in built for key in keys)]


COLUMNS = ("model", "exporter", "grads compared / written", "grad error", "precision", "torch float32 error",
           "train recomputes", "rewritten vs built", "failure")


def _figure(value: float | int | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def row(o: Outcome) -> str:
    """One markdown table row."""
    cells = [o.model, o.exporter, f"{o.gradients_compared} / {o.gradients_written}", _figure(o.gradient_error, ".1e"),
             o.gradient_precision, _figure(o.torch_float32_error, ".1e"), _figure(o.train_recomputes, "d"),
             _figure(o.train_difference, ".1e"), "; ".join(o.problems())[:200]]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--exporters", default="dynamo,legacy")
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds the minimum's solve may take")
    args = parser.parse_args()
    print("| " + " | ".join(COLUMNS) + " |\n|" + " --- |" * len(COLUMNS), flush=True)
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(",") if args.models else _models():
            for exporter in args.exporters.split(","):
                print(row(check(name, exporter, Path(folder), args.time_limit)), flush=True)


if __name__ == "__main__":
    main()
