"""The loss appended to the forward graph: standard ops ending in the scalar tensor `loss`."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from onnx_remat.core.errors import ModelError, UsageError
from onnx_remat.core.options import LOSSES
from onnx_remat.passes.autodiff.emitter import node_attributes
from onnx_remat.passes.autodiff.graph_info import FLOAT_TYPES, GraphInfo

LOSS = "loss"
LABEL = "label"


class _LossGraph:
    """Appends nodes named `loss/<step>` (output named like the node) to a graph."""

    def __init__(self, graph: ir.Graph) -> None:
        self.graph = graph

    def op(self, step: str, op_type: str, *inputs: ir.Value, output: str | None = None, **attrs: Any) -> ir.Value:
        """Add one node; its output is named `output` or like the node."""
        name = f"{LOSS}/{step}"
        node = ir.Node("", op_type, inputs, node_attributes(attrs), num_outputs=1, name=name)
        node.outputs[0].name = output or name
        self.graph.append(node)
        return node.outputs[0]

    def const(self, step: str, value: np.ndarray) -> ir.Value:
        """A Constant node."""
        return self.op(step, "Constant", value=ir.tensor(value))


def add_loss(model: ir.Model, kind: str, info: GraphInfo) -> None:
    """Append the `kind` loss of the first graph output (and the `label` input it needs) to the model."""
    if kind not in LOSSES:
        raise UsageError(f"unknown loss {kind!r}: choose one of {', '.join(LOSSES)}")
    graph = model.graph
    taken = {v.name for v in [*graph.inputs, *graph.outputs] if v.name} | set(graph.initializers)
    taken |= {v.name for node in graph for v in node.outputs if v.name}
    if {LOSS, LABEL} & taken:
        raise ModelError(f"the model already has a tensor named {LOSS!r} or {LABEL!r}: rename it")
    output = graph.outputs[0]
    if info.dtype(output) not in FLOAT_TYPES:
        raise ModelError(f"output {output.name!r} is not floating-point: an integer-only path has no gradient")
    shape, elem = info.shape(output), info.dtype(output)
    losses = _LossGraph(graph)
    if kind == "sum":
        loss = losses.op("sum", "ReduceSum", output, output=LOSS, keepdims=0)
    elif kind == "mse":
        label = ir.Value(name=LABEL, type=ir.TensorType(elem), shape=ir.Shape(shape))
        graph.inputs.append(label)
        diff = losses.op("diff", "Sub", output, label)
        loss = losses.op("mean", "ReduceMean", losses.op("square", "Mul", diff, diff), output=LOSS, keepdims=0)
    else:
        loss = _cross_entropy(losses, output, shape, elem)
    loss.dtype, loss.shape = elem, ir.Shape([])
    graph.outputs.append(loss)


def _cross_entropy(losses: _LossGraph, output: ir.Value, shape: tuple[int, ...], elem: ir.DataType) -> ir.Value:
    """Mean over the batch of -log_softmax(output)[label], with int64 labels of shape [batch]."""
    if len(shape) != 2:
        raise ModelError(f"cross-entropy needs an output of shape [batch, classes], not {list(shape)}: use mse or sum")
    batch, classes = shape
    label = ir.Value(name=LABEL, type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([batch]))
    losses.graph.inputs.append(label)
    log_p = losses.op("log_softmax", "LogSoftmax", output, axis=1)
    column = losses.op("label_column", "Unsqueeze", label, losses.const("axes", np.array([1], np.int64)))
    match = losses.op("match", "Equal", column, losses.const("classes", np.arange(classes, dtype=np.int64)))
    one_hot = losses.op("one_hot", "Cast", match, to=elem)
    total = losses.op("total", "ReduceSum", losses.op("picked", "Mul", log_p, one_hot), keepdims=0)
    scale = np.array(-1 / batch, dtype=elem.numpy())
    return losses.op("mean", "Mul", total, losses.const("scale", scale), output=LOSS)
