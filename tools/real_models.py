"""Rerun the real-model matrix and print the README's table: its architectures (or those beyond it), every exporter.

For each model: inference at the minimum budget (recomputation forced) against the original in onnxruntime;
the training step's loss and gradients (float32) against PyTorch autograd on the module in float64, beside
PyTorch's own float32 error, which shows how ill-conditioned the model is; the training step rewritten
at 50% of keep-all (`--train-budget`; or its minimum, when the budget is below it) against the step as built. Any
failure is the tool's own one-line message. The exporters are the two of PyTorch, and `dynamo23`, the dynamo exporter
at opset 23, and `legacy13`, the legacy one at opset 13, for the architectures that name them.

    python tools/real_models.py [--models resnet18,gpt | --more | --ops] [--exporters legacy,dynamo,dynamo23,legacy13]
        [--time-limit 30] [--train-budget 50%] [--float64]
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch
from float64_reference import run as run_reference
from onnx import numpy_helper
from real_model_zoo import (
    ALL_EXPORTERS,
    ARCHITECTURES,
    MORE_ARCHITECTURES,
    OP_ARCHITECTURES,
    architecture,
    export,
    make,
)
from torch import nn
from torch.nn import functional as F

from onnx_remat.core.errors import InfeasibleBudgetError, RematError, SolverError, one_line
from onnx_remat.passes.execute import ort_session
from onnx_remat.pipeline import RematResult, TrainingOptions, prepare, remat

GRAD_PREFIX = "grad."
OUTPUT_TOLERANCE = 1e-5
"""Largest relative difference of a rewrite's outputs from the original's."""
ZERO_FLOOR = 1e-3
"""Gradients are measured against at least this fraction of the model's largest gradient."""
GRADIENT_TOLERANCE = 1e-4
"""Largest relative gradient error, or twice PyTorch's own float32 error where the model is ill-conditioned."""
FLOAT64_TOLERANCE = 1e-8
"""Largest relative gradient error of the training step built and run in float64."""


@dataclass
class Outcome:
    """What one model and exporter gave; `error` holds the first failure's message."""

    model: str
    exporter: str
    opset: int = 0
    nodes: int = 0
    op_types: tuple[str, ...] = ()
    """The exported model's distinct op types (listed by `--ops`: which ops each exporter writes)."""
    infer_recomputes: int | None = None
    infer_difference: float | None = None
    prepare_seconds: float | None = None
    gradient_error: float | None = None
    gradients_compared: int = 0
    gradients_written: int = 0
    """Gradients the training step writes: each must be of a module parameter, compared with autograd."""
    gradient_precision: str = "float32"
    torch_float32_error: float | None = None
    """PyTorch's own float32 gradients against its float64 ones: how ill-conditioned the model is."""
    train_budget: str = "-"
    train_recomputes: int | None = None
    train_difference: float | None = None
    errors: list[str] = field(default_factory=list)

    def allowed_gradient_error(self) -> float:
        """The tolerance, or twice PyTorch's own float32 error where the model is ill-conditioned; in float64 the
        tolerance is float64's."""
        if self.gradient_precision == "float64":
            return FLOAT64_TOLERANCE
        return max(GRADIENT_TOLERANCE, 2 * (self.torch_float32_error or 0.0))

    def problems(self) -> list[str]:
        """What fails the matrix's tolerances, with the tool's own messages for what did not run."""
        found = list(self.errors)
        if self.infer_difference is not None and self.infer_difference > OUTPUT_TOLERANCE:
            found.append(f"inference outputs differ by {self.infer_difference:.1e}")
        allowed = self.allowed_gradient_error()
        if self.gradient_error is not None and self.gradient_error > allowed:
            found.append(f"gradients differ from autograd by {self.gradient_error:.1e} (allowed {allowed:.1e})")
        if self.gradients_compared < self.gradients_written:
            found.append(f"{self.gradients_written - self.gradients_compared} of {self.gradients_written} gradients "
                         "are of no module parameter")
        if self.train_difference is not None and self.train_difference > OUTPUT_TOLERANCE:
            found.append(f"rewritten training step differs by {self.train_difference:.1e}")
        return found


def relative_difference(got: np.ndarray, want: np.ndarray, floor: float = 1e-12) -> float:
    """Largest absolute difference over the largest magnitude of the reference, or `floor` if that is larger."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    scale = max(float(np.abs(want).max(initial=0.0)), floor)
    return float(np.abs(got - want).max(initial=0.0)) / scale


def example_feeds(name: str, model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    """Inputs in the architecture's own domain (token ids in range, a padding mask), by the model's input names."""
    torch.manual_seed(seed)
    inputs = architecture(name).inputs()
    initializers = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in initializers]
    return {n: t.numpy() for n, t in zip(names, inputs, strict=False)}


def run(model: onnx.ModelProto | str | Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every graph output, by name, from onnxruntime."""
    session = ort_session(model if isinstance(model, onnx.ModelProto) else str(model))
    wanted = {i.name for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in wanted}), strict=True))


def recomputes(model: onnx.ModelProto) -> int:
    """Nodes the rewrite added as recomputations, as the user sees them in the graph."""
    return sum(1 for node in model.graph.node if "__remat" in node.name)


def check_inference(name: str, path: Path, outcome: Outcome, time_limit: float) -> None:
    """Rewrite at the minimum budget; the outputs must equal the original's."""
    result = remat(path, budget="min", time_limit=time_limit)
    feeds = example_feeds(name, result.model)
    want, got = run(path, feeds), run(result.model, feeds)
    outcome.infer_recomputes = recomputes(result.model)
    outcome.infer_difference = max(relative_difference(got[k], v) for k, v in want.items())


def torch_gradients(name: str, label: np.ndarray | None, dtype: torch.dtype) -> tuple[float, dict[str, np.ndarray]]:
    """The zoo module's loss and parameter gradients in training mode and in `dtype`, from PyTorch autograd (`label`
    None for the loss "sum")."""
    module, _ = make(name)
    torch.manual_seed(1)
    return autograd_step(module, architecture(name).inputs(), architecture(name).loss, label, dtype)


def autograd_step(module: nn.Module, inputs: list[torch.Tensor], kind: str, label: np.ndarray | None,
                  dtype: torch.dtype) -> tuple[float, dict[str, np.ndarray]]:
    """`module`'s loss (`kind`, or "sum" where `label` is None) and parameter gradients in training mode and in
    `dtype`, from PyTorch autograd, under every name of a tied parameter (an LM head sharing the embedding:
    exporters write either); `module` computes with its exported file's float32 constants
    (`with_exported_constants`)."""
    with_exported_constants(module).train().to(dtype)
    module.zero_grad(set_to_none=True)
    output = module(*[x.to(dtype) if x.is_floating_point() else x for x in inputs])
    if label is None:
        loss = output.sum()
    else:
        target = torch.from_numpy(label)
        target = target.to(dtype) if target.is_floating_point() else target
        loss = F.cross_entropy(output, target) if kind == "cross-entropy" else F.mse_loss(output, target)
    loss.backward()
    grads = {k: p.grad.numpy() for k, p in module.named_parameters(remove_duplicate=False) if p.grad is not None}
    return loss.item(), grads


FLOAT32_SIXTH = float(np.float32(1 / 6))
"""The slope 1/6 of HardSigmoid and HardSwish as both exporters write it: a float attribute, rounded to float32."""


class ExportedHardsigmoid(nn.Module):
    """nn.Hardsigmoid as the exported HardSigmoid computes it: slope FLOAT32_SIXTH, not 1/6."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x * FLOAT32_SIXTH + 0.5, 0.0, 1.0)


class ExportedHardswish(nn.Module):
    """nn.Hardswish as the exported HardSwish computes it (its function body's HardSigmoid): slope FLOAT32_SIXTH."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.clamp(x * FLOAT32_SIXTH + 0.5, 0.0, 1.0)


EXPORTED_FLOAT_ATTRIBUTES = ("eps", "scale")
"""Module attributes that hold a Python float the forward uses as a constant, which the exported file holds in
float32: normalizations' `eps` (BatchNorm's 1e-3, LayerNorm's 1e-5) and attentions' `scale` (LeViT's, timm's ViT's
`head_dim ** -0.5`)."""


def with_exported_constants(module: nn.Module) -> nn.Module:
    """`module`, changed in place to compute with the float32 constants its exported file holds: every module's
    float attribute in EXPORTED_FLOAT_ATTRIBUTES rounded to float32, nn.Hardsigmoid and nn.Hardswish with slope
    FLOAT32_SIXTH. In float64 the exported model is this function, not the module's: through an ill-conditioned
    network (BatchNorm over 2 values) the 3e-8 difference grows to 4e-6 in the gradients (DeepLabV3's eps and 1/6,
    LeViT's attention scale 8 ** -0.5: 1.6e-6)."""
    exported = {nn.Hardsigmoid: ExportedHardsigmoid, nn.Hardswish: ExportedHardswish}
    for parent in list(module.modules()):
        for key, child in list(parent.named_children()):
            if type(child) in exported:
                setattr(parent, key, exported[type(child)]())
        for name in EXPORTED_FLOAT_ATTRIBUTES:
            if isinstance(getattr(parent, name, None), float):
                setattr(parent, name, float(np.float32(getattr(parent, name))))
    return module


def gradient_errors(built: dict[str, np.ndarray], loss: float, grads: dict[str, np.ndarray]) -> list[float]:
    """Relative errors of the built step's loss and of each gradient it names like a module parameter; a gradient
    that is zero in exact arithmetic (a bias before BatchNorm) is measured against the model's largest gradient."""
    floor = ZERO_FLOOR * max(float(np.abs(g).max(initial=0.0)) for g in grads.values())
    errors = [relative_difference(built["loss"], np.array(loss))]
    for key, want in grads.items():
        if GRAD_PREFIX + key in built:
            errors.append(relative_difference(built[GRAD_PREFIX + key], want, floor))
    return errors


def to_double(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with float32 initializers, Constant and ConstantOfShape values, Casts to float32, inputs and outputs in
    float64 (a module's `.to(float64)` casts to float64 where it cast to float32: HF's masks and scales)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    tensors = [*copy.graph.initializer, *(a.t for n in copy.graph.node if n.op_type in ("Constant", "ConstantOfShape")
                                          for a in n.attribute if a.name == "value")]
    for t in tensors:
        if t.data_type == onnx.TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for a in (a for n in copy.graph.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"):
        if a.i == onnx.TensorProto.FLOAT:
            a.i = onnx.TensorProto.DOUBLE
    for value in [*copy.graph.input, *copy.graph.output]:
        if value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            value.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    del copy.graph.value_info[:]
    return copy


def float64_step_outputs(path: Path, options: TrainingOptions, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The training step built from the float64 model, run by onnx's reference runtime with a Conv that fits in
    memory (tools/float64_reference.py; onnxruntime has no float64 Conv)."""
    step = prepare(to_double(onnx.load(str(path))), mode="train", training=options).proto
    wide = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in feeds.items()}
    return run_reference(step, wide)


def training_feeds(name: str, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Example inputs and a seeded label of the shape and type the training step declares, if it has one."""
    feeds = example_feeds(name, model)
    label = next((i for i in model.graph.input if i.name == "label"), None)
    if label is None:
        return feeds
    shape = [d.dim_value for d in label.type.tensor_type.shape.dim]
    rng = np.random.default_rng(2)
    if label.type.tensor_type.elem_type == onnx.TensorProto.INT64:
        feeds["label"] = rng.integers(0, 3, size=shape).astype(np.int64)
    else:
        feeds["label"] = rng.standard_normal(shape).astype(np.float32)
    return feeds


LIFTED = "*lifted_tensor_*"
"""How torch.export names a tensor created inside forward (Swin's shifted-window mask values): the dynamo exporter
writes it as an initializer even with its optimizer off, and a user training the model freezes it."""


def frozen_constants(name: str, path: Path) -> tuple[str, ...]:
    """What a user training the zoo model at `path` freezes (`frozen_in`)."""
    module, _ = make(name)
    return frozen_in(module, path)


def frozen_in(module: nn.Module, path: Path) -> tuple[str, ...]:
    """What a user training `module`, exported to `path`, freezes: its lifted constants' pattern, if it has any, the
    module's float buffers other than BatchNorm's statistics (rotary cos/sin tables, sinusoidal positions) and its
    parameters that need no gradient (Whisper's sinusoidal positions) that the exporter wrote as initializers, which
    the training step would otherwise train like weights."""
    names = [i.name for i in onnx.load(str(path), load_external_data=False).graph.initializer]
    statistics = {f"{prefix}.{key}".lstrip(".") for prefix, m in module.named_modules()
                  if isinstance(m, nn.modules.batchnorm._BatchNorm) for key, _ in m.named_buffers(recurse=False)}
    buffers = [key for key, b in module.named_buffers() if b.is_floating_point() and key not in statistics]
    fixed = [key for key, p in module.named_parameters() if not p.requires_grad]
    return ((LIFTED,) if fnmatch.filter(names, LIFTED) else ()) + tuple(key for key in buffers + fixed if key in names)


def check_training(name: str, path: Path, outcome: Outcome, time_limit: float, budget: str = "50%",
                   float64: bool = False) -> None:
    """Build the training step, compare it with autograd, then rewrite it at `budget` and compare with itself;
    the gradients are judged in float64 where float32 fails, or always with `float64`."""
    options = TrainingOptions(loss=architecture(name).loss, freeze=frozen_constants(name, path))
    start = time.perf_counter()
    step = prepare(path, mode="train", training=options).proto
    outcome.prepare_seconds = time.perf_counter() - start
    feeds = training_feeds(name, step)
    built = run(step, feeds)
    loss, grads = torch_gradients(name, feeds.get("label"), torch.float64)
    errors = gradient_errors(built, loss, grads)
    outcome.gradient_error = max(errors)
    outcome.gradients_compared = len(errors) - 1
    outcome.gradients_written = sum(k.startswith(GRAD_PREFIX) for k in built)
    torch_loss, torch_grads = torch_gradients(name, feeds.get("label"), torch.float32)
    outcome.torch_float32_error = max(gradient_errors(
        {"loss": np.array(torch_loss), **{GRAD_PREFIX + k: v for k, v in torch_grads.items()}}, loss, grads))
    if float64 or outcome.gradient_error > outcome.allowed_gradient_error():
        # A kink (a ReLU input within float32 rounding of zero) can flip in float32 alone: judge the float64 step.
        outcome.gradient_error = max(gradient_errors(float64_step_outputs(path, options, feeds), loss, grads))
        outcome.gradient_precision = "float64"
    result, outcome.train_budget = rewritten_step(path, options, budget, time_limit)
    outcome.train_recomputes = recomputes(result.model)
    rewritten = run(result.model, feeds)
    outcome.train_difference = max(relative_difference(rewritten[k], v) for k, v in built.items())


def rewritten_step(path: Path, options: TrainingOptions, budget: str, time_limit: float) -> tuple[RematResult, str]:
    """The training step rewritten at `budget`, or at its minimum where `budget` is below it, and the budget used."""
    if budget != "min":
        try:
            return remat(path, budget=budget, mode="train", training=options, time_limit=time_limit,
                         find_minimum=False), budget
        except (InfeasibleBudgetError, SolverError):
            pass
    # At "min" the search's schedule starts the solver: a stated minimum in bytes would leave it to find one.
    return remat(path, budget="min", mode="train", training=options, time_limit=time_limit), "min"


def check(name: str, exporter: str, folder: Path, time_limit: float = 30.0, train_budget: str = "50%",
          float64: bool = False) -> Outcome:
    """Export one architecture and run every check, collecting the tool's messages for what fails; `time_limit`
    bounds each solve (the best schedule found by then is checked), `train_budget` is the training step's, `float64`
    judges every training step in float64 (see `check_training`)."""
    outcome = Outcome(name, exporter)
    path = export(name, exporter, folder / f"{name}.{exporter}.onnx")
    model = onnx.load(str(path), load_external_data=False)
    outcome.opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    outcome.nodes = len(model.graph.node)
    outcome.op_types = tuple(sorted({node.op_type for node in model.graph.node}))
    training_path = export(name, exporter, folder / f"{name}.{exporter}.train.onnx", training=True)
    stages: dict[str, Callable[[], None]] = {
        "inference": lambda: check_inference(name, path, outcome, time_limit),
        "training": lambda: check_training(name, training_path, outcome, time_limit, train_budget, float64),
    }
    for stage, run_stage in stages.items():
        try:
            run_stage()
        except RematError as exc:
            outcome.errors.append(f"{stage}: {exc}")
        except RuntimeError as exc:  # an oracle's own failure: PyTorch cannot run RAFT in float64 (its grid is float32)
            outcome.errors.append(f"{stage}: {type(exc).__name__} in the check: {one_line(exc)}")
    return outcome


def _figure(value: float | int | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


COLUMNS = ("model", "exporter", "opset", "nodes", "infer recomputes", "infer max diff", "train prepare s",
           "grads compared", "grad error", "precision", "torch float32 error", "train budget", "train recomputes",
           "train max diff", "failure")


def _row(o: Outcome) -> list[str]:
    return [o.model, o.exporter, str(o.opset), str(o.nodes), _figure(o.infer_recomputes, "d"),
            _figure(o.infer_difference, ".1e"), _figure(o.prepare_seconds, ".1f"), str(o.gradients_compared),
            _figure(o.gradient_error, ".1e"), o.gradient_precision, _figure(o.torch_float32_error, ".1e"),
            o.train_budget, _figure(o.train_recomputes, "d"), _figure(o.train_difference, ".1e"),
            "; ".join(o.problems())[:200]]


def table(outcomes: list[Outcome]) -> str:
    """The matrix as a Markdown table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += ["| " + " | ".join(_row(o)) + " |" for o in outcomes]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ARCHITECTURES))
    parser.add_argument("--more", action="store_true", help="the architectures beyond the matrix instead")
    parser.add_argument("--ops", action="store_true", help="one small module per op with a gradient rule instead")
    parser.add_argument("--exporters", default=",".join(ALL_EXPORTERS))
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds each solve may take")
    parser.add_argument("--train-budget", default="50%",
                        help="the training step's rewrite budget (min where it is below the minimum; 'min' for one "
                             "that recomputes where 50%% needs no recomputation)")
    parser.add_argument("--float64", action="store_true",
                        help="judge every training step's gradients in float64, also where float32 passes (an "
                             "ill-conditioned model passes in float32 by twice PyTorch's own float32 error)")
    args = parser.parse_args()
    outcomes = []
    with tempfile.TemporaryDirectory() as folder:
        names = MORE_ARCHITECTURES if args.more else OP_ARCHITECTURES if args.ops else args.models.split(",")
        for name in names:
            for exporter in [e for e in args.exporters.split(",") if e in architecture(name).exporters]:
                outcomes.append(check(name, exporter, Path(folder), args.time_limit, args.train_budget,
                                      args.float64))
                print(table(outcomes[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(outcomes))
    if args.ops:
        print("\n| model | exporter | op types written |\n| --- | --- | --- |")
        print("\n".join(f"| {o.model} | {o.exporter} | {' '.join(o.op_types)} |" for o in outcomes))


if __name__ == "__main__":
    main()
