"""What an If holds while one of its branches runs, beyond its inputs and outputs: the tensors the branch's nodes
compute, each from its producer to its last reader inside the branch (onnxruntime plans a subgraph's buffers as a
graph's), a nested If's own the same way. The larger branch counts: the schedule does not know which one runs. A
training step's backward If recomputes its branch's forward inside (passes/autodiff/rules/control.py), so this is
most of its memory.

The branches' tensors have no shapes on the IR (shape resolution sizes the main graph), so the If is shape-inferred
on its own, its outer reads typed from the main graph's sizes.
"""

from __future__ import annotations

import math

import onnx
import onnx_ir as ir
from onnx import helper

from onnx_remat.passes.manager import name_of
from onnx_remat.passes.reads import value_reads
from onnx_remat.passes.sizes import TensorInfo, allocated_bytes


def if_branch_bytes(node: ir.Node, infos: dict[str, TensorInfo]) -> int:
    """The most bytes either branch of an If node holds at once; 0 where an outer read's size is unknown."""
    reads = [name_of(value) for value in value_reads(node)]
    if not all(name in infos for name in reads):
        return 0
    inferred = _inferred_node(node, reads, infos)
    sizes = _value_bytes(inferred)
    return _node_bytes(inferred, sizes)


def _inferred_node(node: ir.Node, reads: list[str], infos: dict[str, TensorInfo]) -> onnx.NodeProto:
    """The If node alone in a model whose inputs are what it reads, shape-inferred (its branches' value_info)."""
    inputs = [helper.make_tensor_value_info(name, infos[name].elem_type, infos[name].shape) for name in reads]
    outputs = [helper.make_tensor_value_info(name_of(value), 0, None) for value in node.outputs if value.name]
    graph = helper.make_graph([ir.serde.serialize_node(node)], "if", inputs, outputs)
    opsets = node.graph.opset_imports if node.graph is not None else {"": 17}
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    return onnx.shape_inference.infer_shapes(model).graph.node[0]


def _value_bytes(node: onnx.NodeProto) -> dict[str, int]:
    """Allocated bytes of every tensor with a concrete shape in the node's subgraphs, nested ones included."""
    sizes: dict[str, int] = {}
    for graph in _subgraphs(node):
        for info in [*graph.value_info, *graph.output]:
            tensor = info.type.tensor_type
            if tensor.elem_type and all(d.HasField("dim_value") for d in tensor.shape.dim):
                itemsize = helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize
                sizes[info.name] = allocated_bytes(itemsize * math.prod(d.dim_value for d in tensor.shape.dim))
        for inner in graph.node:
            sizes.update(_value_bytes(inner))
    return sizes


def _node_bytes(node: onnx.NodeProto, sizes: dict[str, int]) -> int:
    """A node's own bytes beyond its inputs and outputs: for one with subgraphs, its largest subgraph's peak."""
    return max((_graph_peak(graph, sizes) for graph in _subgraphs(node)), default=0)


def _graph_peak(graph: onnx.GraphProto, sizes: dict[str, int]) -> int:
    """The most bytes a subgraph's own tensors take at once while its nodes run in order (its outputs, the node's
    outputs, and what it reads from outside are counted there)."""
    outputs = {value.name for value in graph.output}
    last_read = {name: k for k, inner in enumerate(graph.node) for name in _reads(inner)}
    live: dict[str, int] = {}
    peak = 0
    for k, inner in enumerate(graph.node):
        live.update((name, sizes.get(name, 0)) for name in inner.output if name and name not in outputs)
        peak = max(peak, sum(live.values()) + _node_bytes(inner, sizes))
        for name in [name for name in live if last_read.get(name, -1) <= k]:
            del live[name]
    return peak


def _reads(node: onnx.NodeProto) -> set[str]:
    """Every name a node reads, its subgraphs' reads included (their own names too: a harmless over-count)."""
    names = set(node.input)
    for graph in _subgraphs(node):
        for inner in graph.node:
            names |= _reads(inner)
        names |= {value.name for value in graph.output}
    return names


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node's attributes hold."""
    graphs: list[onnx.GraphProto] = []
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            graphs.append(attribute.g)
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            graphs.extend(attribute.graphs)
    return graphs
