"""What a node reads: its inputs and, for control flow (If, Loop, Scan), the outer tensors its subgraphs use.

An outer read is an edge like an input: the reader must come after the producer, and the tensor lives until
the reader runs. ONNX names such reads only inside the subgraph; on onnx-ir a subgraph's node reads the outer value
itself, so an outer read is one of the value's uses, and every pass that orders nodes, frees tensors or repoints
reads asks here (`value_reads`, `outer_uses`) instead of reading `node.inputs` alone.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

_GRAPH_TYPES = frozenset({ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS})


def is_read(value: ir.Value) -> bool:
    """Whether some node (in a subgraph too) reads an onnx-ir `value` or the graph returns it."""
    return bool(value.uses()) or value.is_graph_output()


def constant_value(value: ir.Value | None) -> np.ndarray | None:
    """The value of a constant input (an initializer or an ONNX Constant node's `value`), or None."""
    if value is None:
        return None
    if value.const_value is not None:
        return value.const_value.numpy()
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx"):
        attribute = producer.attributes.get("value")
        return None if attribute is None else attribute.as_tensor().numpy()
    return None


def value_reads(node: ir.Node) -> list[ir.Value]:
    """The values an onnx-ir `node` reads: its inputs, then its subgraphs' outer reads, each once (blank inputs left
    out)."""
    found = dict.fromkeys(value for value in node.inputs if value is not None)
    if _has_subgraphs(node):
        found.update((value, None) for _, _, value in outer_uses(node))
    return list(found)


def _has_subgraphs(node: ir.Node) -> bool:
    """Whether an attribute of `node` holds a graph: few nodes do, and the question is asked of every node many times
    over while the problem is built (read through the attributes' plain dict, `UserDict.data`: their mapping
    interface took most of the time)."""
    return any(attribute.type in _GRAPH_TYPES for attribute in node.attributes.data.values())


def outer_uses(node: ir.Node) -> list[tuple[ir.Node, int, ir.Value]]:
    """Where `node`'s subgraphs (nested ones included) read a value from outside `node`: (inner node, input index,
    value)."""
    graphs = inner_graphs(node)
    inside = set(graphs)
    return [(inner, index, value) for graph in graphs for inner in graph for index, value in enumerate(inner.inputs)
            if value is not None and value.graph not in inside]


def inner_graphs(node: ir.Node) -> list[ir.Graph]:
    """Every graph inside `node`'s attributes, nested ones included."""
    graphs: list[ir.Graph] = []
    for attribute in node.attributes.values():
        if attribute.type not in _GRAPH_TYPES or attribute.is_ref():
            continue
        tops = [attribute.as_graph()] if attribute.type == ir.AttributeType.GRAPH else list(attribute.as_graphs())
        for graph in tops:
            graphs.extend([graph, *graph.subgraphs()])
    return graphs


def proto_reads(node: onnx.NodeProto) -> list[str]:
    """The names a ModelProto node reads: its inputs, then what its subgraphs (nested ones included) read from
    outside them, each once (blank inputs left out)."""
    found = dict.fromkeys(name for name in node.input if name)
    for attribute in node.attribute:
        graphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
        for graph in graphs:
            defined = {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer}
            for inner in graph.node:
                found.update((name, None) for name in proto_reads(inner) if name not in defined)
                defined.update(inner.output)
    return list(found)
