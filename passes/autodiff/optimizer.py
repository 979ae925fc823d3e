"""The optimizer step appended to a training graph, so the model computes a complete train step."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_remat.errors import ModelError, UsageError

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


def add_sgd(graph: onnx.GraphProto, params: Sequence[str], grads: Sequence[str], lr: float) -> dict[str, list[str]]:
    """Append `<param>.updated = param - lr * grad` (nodes `sgd/<param>...`) and its outputs; param -> node names."""
    _check_free(graph, params)
    inits = {i.name: i for i in graph.initializer}
    nodes: dict[str, list[str]] = {}
    for param, grad in zip(params, grads, strict=True):
        init = inits[param]
        rate = numpy_helper.from_array(np.asarray(lr, dtype=helper.tensor_dtype_to_np_dtype(init.data_type)))
        prefix = f"sgd/{param}"
        graph.node.extend([
            helper.make_node("Constant", [], [f"{prefix}/lr"], name=f"{prefix}/lr", value=rate),
            helper.make_node("Mul", [f"{prefix}/lr", grad], [f"{prefix}/step"], name=f"{prefix}/step"),
            helper.make_node("Sub", [param, f"{prefix}/step"], [updated_name(param)], name=prefix),
        ])
        graph.output.append(helper.make_tensor_value_info(updated_name(param), init.data_type, list(init.dims)))
        nodes[param] = [f"{prefix}/lr", f"{prefix}/step", prefix]
    return nodes


def _check_free(graph: onnx.GraphProto, params: Sequence[str]) -> None:
    """ModelError if a name the step needs is already used in the graph."""
    taken = {n.name for n in graph.node} | {t for n in graph.node for t in [*n.input, *n.output]}
    taken |= {v.name for v in [*graph.input, *graph.output]} | {i.name for i in graph.initializer}
    wanted = [name for p in params for name in (f"sgd/{p}", f"sgd/{p}/lr", f"sgd/{p}/step", updated_name(p))]
    clashes = sorted(taken.intersection(wanted))
    if clashes:
        raise ModelError(f"the model already uses {', '.join(clashes[:3])}: rename it to add the optimizer step")
