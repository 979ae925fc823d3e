"""What a node reads: its inputs and, for control flow (If, Loop, Scan), the outer tensors its subgraphs use.

An outer read is an edge like an input: the reader must come after the producer, and the tensor lives until
the reader runs. ONNX names such reads only inside the subgraph, so every pass that orders nodes, frees
tensors or renames them asks here instead of reading `node.input`. On onnx-ir a subgraph's node reads the outer
value itself, so an outer read is one of the value's uses: `outer_uses` lists them for a node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import onnx_ir as ir
from onnx import AttributeProto, GraphProto, NodeProto

_GRAPH_TYPES = frozenset({ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS})


def reads(node: NodeProto) -> list[str]:
    """The tensors `node` reads: its inputs, then its subgraphs' outer reads (blank optional inputs left out)."""
    return [name for name in node.input if name] + outer_reads(node)


def outer_reads(node: NodeProto) -> list[str]:
    """The outer-scope tensors `node`'s subgraphs read, each once, in order of first use."""
    found: dict[str, None] = {}
    for graph in _subgraphs(node):
        for name in _free_names(graph):
            found.setdefault(name)
    return list(found)


def rename_outer_reads(node: NodeProto, rename: Callable[[str], str]) -> None:
    """Point `node`'s subgraphs' outer reads at `rename(name)` (a recomputed instance of the tensor)."""
    for graph in _subgraphs(node):
        free = set(_free_names(graph))
        _rename_in(graph, {name: rename(name) for name in free})


def _subgraphs(node: NodeProto) -> Iterator[GraphProto]:
    for attribute in node.attribute:
        if attribute.type == AttributeProto.GRAPH:
            yield attribute.g
        elif attribute.type == AttributeProto.GRAPHS:
            yield from attribute.graphs


def _free_names(graph: GraphProto) -> list[str]:
    """Names `graph` (and its nested subgraphs) read without defining them."""
    defined = {value.name for value in graph.input} | {init.name for init in graph.initializer}
    defined |= {init.values.name for init in graph.sparse_initializer}
    free: dict[str, None] = {}
    for node in graph.node:
        for name in reads(node):
            if name not in defined:
                free.setdefault(name)
        defined.update(name for name in node.output if name)
    for value in graph.output:
        if value.name not in defined:
            free.setdefault(value.name)
    return list(free)


def _rename_in(graph: GraphProto, renames: dict[str, str]) -> None:
    """Rename free reads in `graph` and its nested subgraphs (names it defines shadow nothing: ONNX forbids it)."""
    for node in graph.node:
        node.input[:] = [renames.get(name, name) for name in node.input]
        for inner in _subgraphs(node):
            _rename_in(inner, renames)
    for value in graph.output:
        value.name = renames.get(value.name, value.name)


def is_read(value: ir.Value) -> bool:
    """Whether some node (in a subgraph too) reads an onnx-ir `value` or the graph returns it."""
    return bool(value.uses()) or value.is_graph_output()


def value_reads(node: ir.Node) -> list[ir.Value]:
    """The values an onnx-ir `node` reads: its inputs, then its subgraphs' outer reads, each once (blank inputs left
    out)."""
    found = dict.fromkeys(value for value in node.inputs if value is not None)
    found.update((value, None) for _, _, value in outer_uses(node))
    return list(found)


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
