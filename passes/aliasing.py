"""Nodes whose output onnxruntime places in their input's buffer: the output takes no memory of its own.

Measured with onnxruntime 1.32 on CPU (arena, memory patterns and buffer reuse off): Reshape, Flatten,
Squeeze, Unsqueeze and Identity into an intermediate tensor write no new buffer (a 4 MiB tensor and its
reshape, both alive, peak at 4 MiB; the same from a graph input), and the shared buffer lives until the
last reader of either tensor. Into a graph output they copy (8 MiB). Dropout copies.

The activations of IN_PLACE_OPS write into their input's buffer when they are its last reader and it is an
intermediate (neither a graph input, an initializer nor a graph output), even with buffer reuse off: Neg -> Relu ->
ReduceSum on 4 MiB peaks at 4 MiB, 8 with a later second reader of the Neg, 4 again when the Relu reads it last.
Exp, Erf, Sqrt, Neg, Gelu and the binary ops (Add, Mul, Sub, Div, Where) write a buffer of their own.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx_ir as ir

from onnx_remat.passes.manager import name_of
from onnx_remat.passes.reads import value_reads

ALIASING_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
IN_PLACE_OPS = frozenset({"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "Elu", "Selu", "Celu", "HardSigmoid",
                          "Softplus", "Softsign", "ThresholdedRelu", "Softmax", "LogSoftmax"})


def shared_buffers(nodes: Iterable[ir.Node], graph_outputs: set[str]) -> dict[str, str]:
    """For each tensor written into another's buffer, the tensor that owns the buffer (chains followed), with
    `nodes` run in their order: a view always, an in-place activation when it reads last a tensor they produce."""
    nodes = list(nodes)
    produced = {name_of(value) for node in nodes for value in node.outputs}
    last_reader = {name_of(value): k for k, node in enumerate(nodes) for value in value_reads(node)}
    owner: dict[str, str] = {}
    for k, node in enumerate(nodes):
        if node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] is None:
            continue
        output, source = name_of(node.outputs[0]), name_of(node.inputs[0])
        in_place = node.op_type in IN_PLACE_OPS and source in produced and source not in graph_outputs and \
            last_reader.get(source) == k
        if output not in graph_outputs and (node.op_type in ALIASING_OPS or in_place):
            owner[output] = owner.get(source, source)
    return owner


def writes_in_place(node: ir.Node) -> bool:
    """Whether `node` is an in-place activation that alone reads an intermediate (so it reads it last in any order)."""
    source = node.inputs[0] if node.op_type in IN_PLACE_OPS and node.domain in ("", "ai.onnx") and node.inputs \
        else None
    return source is not None and source.producer() is not None and not source.is_graph_output() and all(
        use.node is node for use in source.uses()) and not any(output.is_graph_output() for output in node.outputs)
