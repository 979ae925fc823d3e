"""Splits whose outputs are only partly read become Slices of the read parts.

A recomputed Split often serves one reader, which takes one of its outputs: onnxruntime holds the others, which
nobody reads, until the run ends, while the problem frees them with the rest of the instance. An unrolled GRU's
training step at its minimum budget measured 1.8x its prediction so. Slicing out only the parts read gives the
same values and holds nothing unread.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import NodeProto, TensorProto, helper, numpy_helper

Shape = Callable[[str], "list[int] | None"]
"""A tensor's concrete shape by its name in the rewritten graph, or None if unknown."""


def slice_partly_read_splits(
    nodes: list[NodeProto], read: set[str], shape_of: Shape
) -> tuple[list[NodeProto], list[TensorProto], dict[str, str]]:
    """`nodes` with each Split that has an unread output (but not none read) replaced by one Slice per read output,
    tagged as the Split was, the small constant tensors the Slices take, and each Slice's name -> its Split's.
    `read`: the tensors some node reads or the graph returns."""
    kept: list[NodeProto] = []
    constants: list[TensorProto] = []
    replaced: dict[str, str] = {}
    for node in nodes:
        outputs = [name for name in node.output if name]
        wanted = [name for name in outputs if name in read]
        split = _split_sizes(node, shape_of)
        if split is None or not wanted or len(wanted) == len(outputs) or len(outputs) != len(node.output):
            kept.append(node)
            continue
        axis, sizes = split
        start = 0
        for name, size in zip(outputs, sizes, strict=True):
            end = start + size
            if name in wanted:
                slice_node, tensors = _slice(node, name, axis, start, end)
                kept.append(slice_node)
                replaced[slice_node.name] = node.name
                constants.extend(tensors)
            start = end
    return kept, constants, replaced


def _split_sizes(node: NodeProto, shape_of: Shape) -> tuple[int, list[int]] | None:
    """A Split's axis, counted from the front, and each output's size along it, if every output's shape is known;
    None for other nodes."""
    if node.op_type != "Split" or node.domain not in ("", "ai.onnx"):
        return None
    shapes = [shape_of(name) for name in node.output]
    known = [shape for shape in shapes if shape]  # a Split's outputs have rank 1 at least: () is an unknown rank
    if len(known) < len(shapes):
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % len(known[0])
    return axis, [shape[axis] for shape in known]


def _slice(split: NodeProto, output: str, axis: int, start: int, end: int) -> tuple[NodeProto, list[TensorProto]]:
    """A Slice of `split`'s input from `start` to `end` along `axis` into `output`, with its constant inputs."""
    name = f"{split.name}/{output}"
    tensors = [numpy_helper.from_array(np.array([value], dtype=np.int64), f"{name}/{role}")
               for role, value in (("starts", start), ("ends", end), ("axes", axis))]
    node = helper.make_node("Slice", [split.input[0], *(t.name for t in tensors)], [output], name=name)
    node.metadata_props.extend(split.metadata_props)
    return node, tensors
