"""The loss appended to the forward graph: standard ops ending in the scalar tensor `loss`."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_remat.errors import ModelError, UsageError
from onnx_remat.options import LOSSES
from onnx_remat.passes.autodiff.graph_info import FLOAT_TYPES, GraphInfo

LOSS = "loss"
LABEL = "label"


class _LossGraph:
    """Appends nodes named `loss/<step>` (output named like the node) to a graph."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph

    def op(self, step: str, op_type: str, *inputs: str, output: str | None = None, **attrs: Any) -> str:
        """Add one node; its output is `output` or the node's name."""
        name = f"{LOSS}/{step}"
        self.graph.node.append(helper.make_node(op_type, list(inputs), [output or name], name=name, **attrs))
        return output or name

    def const(self, step: str, value: np.ndarray) -> str:
        """A Constant node."""
        return self.op(step, "Constant", value=numpy_helper.from_array(value))


def add_loss(model: onnx.ModelProto, kind: str, info: GraphInfo) -> None:
    """Append the `kind` loss of the first graph output (and the `label` input it needs) to the model."""
    if kind not in LOSSES:
        raise UsageError(f"unknown loss {kind!r}: choose one of {', '.join(LOSSES)}")
    graph = model.graph
    taken = {v.name for v in [*graph.input, *graph.output, *graph.value_info]} | {i.name for i in graph.initializer}
    if {LOSS, LABEL} & taken:
        raise ModelError(f"the model already has a tensor named {LOSS!r} or {LABEL!r}: rename it")
    output = graph.output[0].name
    if info.dtype(output) not in FLOAT_TYPES:
        raise ModelError(f"output {output!r} is not floating-point: an integer-only path has no gradient")
    shape, elem = info.shape(output), info.dtype(output)
    losses = _LossGraph(graph)
    if kind == "sum":
        losses.op("sum", "ReduceSum", output, output=LOSS, keepdims=0)
    elif kind == "mse":
        graph.input.append(helper.make_tensor_value_info(LABEL, elem, list(shape)))
        diff = losses.op("diff", "Sub", output, LABEL)
        losses.op("mean", "ReduceMean", losses.op("square", "Mul", diff, diff), output=LOSS, keepdims=0)
    else:
        _cross_entropy(losses, output, shape, elem)
    graph.output.append(helper.make_tensor_value_info(LOSS, elem, []))


def _cross_entropy(losses: _LossGraph, output: str, shape: tuple[int, ...], elem: int) -> None:
    """Mean over the batch of -log_softmax(output)[label], with int64 labels of shape [batch]."""
    if len(shape) != 2:
        raise ModelError(f"cross-entropy needs an output of shape [batch, classes], not {list(shape)}: use mse or sum")
    batch, classes = shape
    losses.graph.input.append(helper.make_tensor_value_info(LABEL, TensorProto.INT64, [batch]))
    log_p = losses.op("log_softmax", "LogSoftmax", output, axis=1)
    column = losses.op("label_column", "Unsqueeze", LABEL, losses.const("axes", np.array([1], np.int64)))
    match = losses.op("match", "Equal", column, losses.const("classes", np.arange(classes, dtype=np.int64)))
    one_hot = losses.op("one_hot", "Cast", match, to=elem)
    total = losses.op("total", "ReduceSum", losses.op("picked", "Mul", log_p, one_hot), keepdims=0)
    scale = np.array(-1 / batch, dtype=helper.tensor_dtype_to_np_dtype(elem))
    losses.op("mean", "Mul", total, losses.const("scale", scale), output=LOSS)
