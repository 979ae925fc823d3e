"""Turn exporters' tensor sequences back into tensors: SplitToSequence read by SequenceAt at constant positions
(torch.chunk and torch.split as the dynamo exporter writes them without its optimizer) becomes one Slice per
position read, so every value of the graph is a tensor with a size the solver can count."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from onnx_remat.passes.reads import constant_value


class SequenceReadsToSlices(ir.passes.InPlacePass):
    """Replace each SequenceAt(SplitToSequence(x, split), p) with constant split and p by a Slice of x, then remove
    what only the replaced nodes read (onnx-ir's RemoveUnusedNodesPass)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(model.graph):
            if node.op_type == "SplitToSequence" and node.domain in ("", "ai.onnx"):
                modified |= _slice_reads(model.graph, node)
        if modified:
            RemoveUnusedNodesPass()(model)
        return ir.passes.PassResult(model, modified)


def _slice_reads(graph: ir.Graph, split: ir.Node) -> bool:
    """Slice out every constant-position read of one SplitToSequence; False if any read is not of that form."""
    sizes = constant_value(split.inputs[1]) if len(split.inputs) > 1 else None
    reads = list(split.outputs[0].consumers())
    constants = [constant_value(r.inputs[1]) if r.op_type == "SequenceAt" else None for r in reads]
    positions = [int(p) for p in constants if p is not None]
    if sizes is None or not reads or len(positions) < len(reads) or any(p < 0 for p in positions):
        return False
    axis = split.attributes["axis"].as_int() if "axis" in split.attributes else 0
    for read, position in zip(reads, positions, strict=True):
        start, size = _chunk(sizes, position)
        bounds = [ir.Value(name=f"{read.name}/{key}", const_value=ir.tensor(np.array([v], np.int64)))
                  for key, v in (("start", start), ("end", start + size), ("axis", axis))]
        for bound in bounds:
            graph.register_initializer(bound)
        piece = ir.Node("", "Slice", [split.inputs[0], *bounds], name=f"{read.name}/slice", num_outputs=1)
        graph.insert_before(read, piece)
        name = read.outputs[0].name
        ir.convenience.replace_all_uses_with(read.outputs[0], piece.outputs[0], replace_graph_outputs=True)
        read.outputs[0].name = f"{name}/replaced"
        piece.outputs[0].name = name
        graph.remove(read, safe=True)
    graph.remove(split, safe=True)
    return True


def _chunk(sizes: np.ndarray, position: int) -> tuple[int, int]:
    """Start and size of chunk `position`: a scalar split is one size for every chunk, a list gives each."""
    if sizes.ndim == 0:
        return position * int(sizes), int(sizes)
    return int(sizes[:position].sum()), int(sizes[position])

