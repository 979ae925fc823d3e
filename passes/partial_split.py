"""Splits whose outputs are only partly read become Slices of the read parts.

A recomputed Split often serves one reader, which takes one of its outputs: onnxruntime holds the others, which
nobody reads, until the run ends, while the problem frees them with the rest of the instance. An unrolled GRU's
training step at its minimum budget measured 1.8x its prediction so. Slicing out only the parts read gives the
same values and holds nothing unread.

An in-place change of an onnx-ir graph: each Slice takes the place of its Split, its output the read output's name,
shape and readers (replace_all_uses_with), and the Split goes. The Slices' starts, ends and axes are one-element
initializers shared by value across the graph: the problem never sees them, and onnxruntime holds each initializer
for the whole run (about 360 bytes for 8 of data), so one per Slice made Mamba's inference rewrite at its minimum
(681 of them, 0.23 MiB) measure over its budget.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnx_remat.passes.reads import is_read

SHARED_PREFIX = "onnx_remat.slice_int64/"
"""The name of a shared Slice constant, its value appended."""


def slice_partly_read_splits(graph: ir.Graph) -> None:
    """Replace each Split of `graph` that has an unread output (but not none read) by one Slice per read output,
    tagged as the Split was, whose constant inputs become initializers."""
    for node in list(graph):
        outputs = [value for value in node.outputs if value.name]
        wanted = [value for value in outputs if is_read(value)]
        split = _split_sizes(node)
        if split is None or not wanted or len(wanted) == len(outputs) or len(outputs) != len(node.outputs):
            continue
        axis, sizes = split
        start = 0
        for value, size in zip(outputs, sizes, strict=True):
            end = start + size
            if value in wanted:
                _slice_into(graph, node, value, axis, start, end)
            start = end
        for index in range(len(node.inputs)):
            node.replace_input_with(index, None)
        graph.remove(node)


def _split_sizes(node: ir.Node) -> tuple[int, list[int]] | None:
    """A Split's axis, counted from the front, and each output's size along it, if every output's shape is known;
    None for other nodes."""
    if node.op_type != "Split" or node.domain not in ("", "ai.onnx"):
        return None
    shapes = [_static_shape(value) for value in node.outputs]
    known = [shape for shape in shapes if shape]  # a Split's outputs have rank 1 at least: () is an unknown rank
    if len(known) < len(shapes):
        return None
    axis = node.attributes.get_int("axis", 0) % len(known[0])
    return axis, [shape[axis] for shape in known]


def _static_shape(value: ir.Value) -> list[int] | None:
    """`value`'s concrete shape, or None if unknown."""
    dims = [] if value.shape is None else [dim for dim in value.shape if isinstance(dim, int)]
    return None if value.shape is None or len(dims) < len(value.shape) else dims


def _slice_into(graph: ir.Graph, split: ir.Node, output: ir.Value, axis: int, start: int, end: int) -> None:
    """Insert before `split` a Slice of its input from `start` to `end` along `axis` that takes the place of `output`,
    with its constant inputs as initializers."""
    constants = [_constant(graph, value) for value in (start, end, axis)]
    node = ir.Node("", "Slice", [split.inputs[0], *constants], name=f"{split.name}/{output.name}",
                   metadata_props=dict(split.metadata_props))
    result = node.outputs[0]
    result.name, result.type, result.shape = output.name, output.type, output.shape
    graph.insert_before(split, node)
    output.replace_all_uses_with(result, replace_graph_outputs=True)


def _constant(graph: ir.Graph, value: int) -> ir.Value:
    """The one-element int64 initializer of `graph` holding `value`, made by the first Slice that needs it."""
    name = f"{SHARED_PREFIX}{value}"
    if name in graph.initializers:
        return graph.initializers[name]
    tensor = ir.tensor(np.array([value], dtype=np.int64), name=name)
    constant = ir.Value(name=name, type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([1]), const_value=tensor)
    graph.register_initializer(constant)
    return constant
