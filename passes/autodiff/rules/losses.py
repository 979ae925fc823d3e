"""Gradients of the loss ops exporters write when the loss is inside the model (opset 12-22):
NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, with their reductions, ignore_index and class weights."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import attr_int, attr_str, has_attr, present

Grads = Sequence[ir.Value]
Needs = Sequence[bool]


def _picked_weights(e: Emitter, node: ir.Node) -> ir.Value:
    """Per input element (N, C, d...): the weight of class c where c is the element's label, else 0; 0 too where
    the label is ignore_index. Built by comparison, so an ignore_index outside [0, C) gathers nothing."""
    scores, labels = (present(v) for v in node.inputs[:2])
    shape = e.info.shape(scores)
    column = e.op("Unsqueeze", labels, e.ints([1]))
    classes = np.arange(shape[1], dtype=e.info.np_dtype(labels)).reshape(1, shape[1], *[1] * (len(shape) - 2))
    picked = e.op("Cast", e.op("Equal", column, e.const(classes)), to=e.info.dtype(scores))
    if has_attr(node, "ignore_index"):
        ignored = e.op("Equal", column, e.const_like(labels, attr_int(node, "ignore_index")))
        picked = e.op("Where", ignored, e.scalar(0.0), picked)
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        weights = e.reshape(node.inputs[2], classes.shape)
        picked = e.op("Mul", picked, weights)
    return picked


def _log_prob_grad(e: Emitter, node: ir.Node, dy: ir.Value) -> ir.Value:
    """The loss's gradient with respect to the log-probabilities (the first input of NegativeLogLikelihoodLoss):
    -dy times the picked weight, dy divided by the picked weights' total for the mean."""
    picked = _picked_weights(e, node)
    reduction = attr_str(node, "reduction", "mean")
    if reduction == "none":
        dy = e.op("Unsqueeze", dy, e.ints([1]))
    elif reduction == "mean":
        total = e.reduce_sum(picked, list(range(len(e.info.shape(node.inputs[0])))), keepdims=False)
        dy = e.op("Div", dy, total)
    return e.op("Neg", e.op("Mul", picked, dy))


def negative_log_likelihood(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """d loss / d input: -dy w[label] at each element's label (scaled for the mean), zero elsewhere."""
    return {0: _log_prob_grad(e, node, dys[0])}


def softmax_cross_entropy(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """The loss is NegativeLogLikelihoodLoss of log_prob = LogSoftmax(scores, axis 1), the optional second output:
    its gradient (plus log_prob's own) goes back through the log-softmax, g - softmax(scores) sum_c(g)."""
    g = _log_prob_grad(e, node, dys[0])
    if len(dys) > 1:
        g = e.op("Add", g, dys[1])
    log_prob = node.outputs[1] if len(node.outputs) > 1 and node.outputs[1].name else None
    if log_prob is None:
        log_prob = e.op("LogSoftmax", node.inputs[0], axis=1)
    total = e.reduce_sum(g, [1], keepdims=True)
    return {0: e.op("Sub", g, e.op("Mul", e.op("Exp", log_prob), total))}
