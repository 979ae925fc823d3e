"""Gradients of ops that reorder or fold elements: ReverseSequence (opset 10-28) and Col2Im (opset 18)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import attr_int, attr_ints

Grads = Sequence[ir.Value]
Needs = Sequence[bool]


def reverse_sequence(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Reversing each sequence's first lengths[b] steps is its own inverse: dy goes through the same op."""
    attributes = {"batch_axis": attr_int(node, "batch_axis", 1), "time_axis": attr_int(node, "time_axis", 0)}
    return {0: e.op("ReverseSequence", dys[0], node.inputs[1], **attributes)}


def col2im(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Col2Im (torch's fold) sums each column into its block of the image; the gradient reads each block back into
    its column (unfold): a Conv of every channel alone with a one-hot kernel per block position."""
    columns = e.info.shape(node.inputs[0])
    image = [int(v) for v in e.info.static(node.inputs[1])]
    block = [int(v) for v in e.info.static(node.inputs[2])]
    positions = math.prod(block)
    channels = columns[1] // positions
    rank = len(block)
    one_hot = np.eye(positions, dtype=e.dtype).reshape(positions, 1, *block)
    planes = e.reshape(dys[0], [columns[0] * channels, 1, *image])
    unfolded = e.op("Conv", planes, e.const(one_hot), dilations=attr_ints(node, "dilations", [1] * rank),
                    pads=attr_ints(node, "pads", [0] * 2 * rank), strides=attr_ints(node, "strides", [1] * rank))
    return {0: e.reshape(unfolded, columns)}
