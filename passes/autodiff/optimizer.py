"""The optimizer step appended to a training graph, so the model computes a complete train step."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnx_remat.core.errors import ModelError, UsageError
from onnx_remat.passes.autodiff.emitter import node_attributes
from onnx_remat.passes.manager import named

OPTIMIZERS = ("sgd",)
UPDATED_SUFFIX = ".updated"


def updated_name(param: str) -> str:
    """The graph output holding a parameter's value after the step."""
    return f"{param}{UPDATED_SUFFIX}"


def check_optimizer(optimizer: str | None, lr: float) -> None:
    """UsageError for an unknown optimizer or a learning rate that is not a positive finite number."""
    if optimizer is not None and optimizer not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {optimizer!r}: choose one of {', '.join(OPTIMIZERS)} (or none)")
    if not (isinstance(lr, int | float) and math.isfinite(lr) and lr > 0):
        raise UsageError(f"the learning rate must be a positive finite number, not {lr!r}")


def add_sgd(graph: ir.Graph, params: Sequence[ir.Value], grads: Sequence[ir.Value], lr: float
            ) -> dict[str, list[str]]:
    """Append `<param>.updated = param - lr * grad` (nodes `sgd/<param>...`) and its outputs; param -> node names."""
    names = [named(p) for p in params]
    _check_free(graph, names)
    steps: dict[str, list[str]] = {}
    for param, name, grad in zip(params, names, grads, strict=True):
        prefix = f"sgd/{name}"
        dtype = param.dtype
        if dtype is None:
            raise ModelError(f"parameter {name!r} has no element type: fix the model's initializers")
        rate = _node(graph, "Constant", [], f"{prefix}/lr", f"{prefix}/lr",
                     value=ir.tensor(np.asarray(lr, dtype=dtype.numpy())))
        step = _node(graph, "Mul", [rate, grad], f"{prefix}/step", f"{prefix}/step")
        updated = _node(graph, "Sub", [param, step], prefix, updated_name(name))
        updated.dtype, updated.shape = dtype, param.shape
        graph.outputs.append(updated)
        steps[name] = [f"{prefix}/lr", f"{prefix}/step", prefix]
    return steps


def _node(graph: ir.Graph, op_type: str, inputs: Sequence[ir.Value], name: str, output: str,
          **attrs: ir.TensorProtocol) -> ir.Value:
    """Append a one-output node named `name`; its output, named `output`."""
    node = ir.Node("", op_type, inputs, node_attributes(attrs), num_outputs=1, name=name)
    node.outputs[0].name = output
    graph.append(node)
    return node.outputs[0]


def _check_free(graph: ir.Graph, params: Sequence[str]) -> None:
    """ModelError if a name the step needs is already used in the graph."""
    values = [*graph.inputs, *graph.outputs, *(v for n in graph for v in [*n.inputs, *n.outputs])]
    taken = {n.name for n in graph if n.name} | {v.name for v in values if v is not None and v.name}
    taken |= set(graph.initializers)
    wanted = [name for p in params for name in (f"sgd/{p}", f"sgd/{p}/lr", f"sgd/{p}/step", updated_name(p))]
    clashes = sorted(taken.intersection(wanted))
    if clashes:
        raise ModelError(f"the model already uses {', '.join(clashes[:3])}: rename it to add the optimizer step")
