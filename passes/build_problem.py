"""Turn a shape-inferred ONNX graph into the solver's Problem and the OpMap back to its nodes.

An operator is a group of nodes: one node in inference, a forward node or the nodes of its
gradient in training (the paper's T = 2N). Nodes whose inputs are all constant (Constant nodes,
plumbing fed only by initializers) run once up front and their outputs count as resident.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx

from onnx_remat.opmap import OpMap
from onnx_remat.passes.aliasing import shared_buffers
from onnx_remat.passes.reads import reads
from onnx_remat.passes.sizes import TensorInfo
from onnx_remat.problem import Problem

NodeCost = Callable[[onnx.NodeProto, dict[str, TensorInfo]], float]
NodeWorkspace = Callable[[onnx.NodeProto, dict[str, TensorInfo]], int]


@dataclass(frozen=True)
class GraphProblem:
    """The problem for a graph and the nodes behind each of its operators."""

    problem: Problem
    opmap: OpMap


def build_problem(
    model: onnx.ModelProto,
    infos: dict[str, TensorInfo],
    device_costs: dict[str, NodeCost],
    workspace: NodeWorkspace,
    groups: Sequence[Sequence[str]] | None = None,
    roles: Sequence[str] = (),
) -> GraphProblem:
    """Operators (node groups in a topological order), edges, sizes and per-device costs of `model`.

    Without `groups`, every non-constant node is its own operator, in the model's node order. A group of
    constant nodes only runs up front. `roles[i]` says whether group i is forward or backward.
    """
    graph = model.graph
    constants = _constant_tensors(graph)
    by_name = {node.name: node for node in graph.node}
    constant = {node.name for node in graph.node if _is_constant_node(node, constants)}
    if groups is None:
        groups = [(node.name,) for node in graph.node]
    # A constant node runs up front unless it belongs to a group with real work, where it is recomputed
    # with the group and its output stays transient (e.g. a weight rescaled for one gradient).
    prelude = [name for group in groups if all(n in constant for n in group) for name in group]
    graph_outputs = {o.name for o in graph.output}
    kept = _attach_views([(tuple(names), role) for names, role in zip(groups, roles or [""] * len(groups),
                                                                       strict=True)
                          if not all(n in constant for n in names)], by_name, graph_outputs)
    ops = [[by_name[name] for name in names] for names, _ in kept]
    producer = {out: g for g, nodes in enumerate(ops) for node in nodes for out in node.output if out}
    consumers = _consumers(ops)
    exported = [
        [o for node in nodes for o in node.output if o and (o in graph_outputs or consumers.get(o, {g}) - {g})]
        for g, nodes in enumerate(ops)
    ]
    edges = sorted({(producer[i], g) for g, nodes in enumerate(ops) for n in nodes for i in reads(n)
                    if i in producer and producer[i] != g})
    inputs = {i.name for i in graph.input}
    held = {i.name for i in graph.initializer} | inputs | {o for name in prelude for o in by_name[name].output}
    resident = sum(infos[name].nbytes for name in held if name in infos)
    output_bytes = [_buffer_bytes(nodes, outs, infos, graph_outputs, held) for nodes, outs in zip(ops, exported,
                                                                                                   strict=True)]
    devices = tuple(device_costs)
    problem = Problem(
        op_names=tuple(_group_name(nodes) for nodes in ops),
        edges=tuple(edges),
        output_bytes=tuple(output_bytes),
        cost=tuple(tuple(sum(cost(n, infos) for n in nodes) for nodes in ops) for cost in device_costs.values()),
        resident_bytes=(resident,) * len(devices),
        budgets=(0,) * len(devices),
        graph_outputs=_held_to_end(ops, exported, producer, graph_outputs),
        devices=devices,
        workspace_bytes=tuple(
            _group_workspace(nodes, set(outs), size, infos, workspace, graph_outputs)
            for nodes, outs, size in zip(ops, exported, output_bytes, strict=True)
        ),
        copy_seconds_per_byte=tuple((0.0,) * len(devices) for _ in devices),
    )
    node_names = tuple(tuple(n.name for n in nodes) for nodes in ops)
    kept_roles = tuple(role for _, role in kept) if roles else ()
    return GraphProblem(problem, OpMap(node_names, tuple(prelude), kept_roles))


def _held_to_end(
    ops: list[list[onnx.NodeProto]], exported: list[list[str]], producer: dict[str, int], graph_outputs: set[str]
) -> tuple[int, ...]:
    """Operators producing graph outputs, and those whose output nothing reads: onnxruntime holds an
    unread output until the run ends, so the problem must too."""
    unread = {g for g, outs in enumerate(exported) if not outs}
    return tuple(sorted({producer[o] for o in graph_outputs if o in producer} | unread))


def _group_name(nodes: list[onnx.NodeProto]) -> str:
    return nodes[0].name if len(nodes) == 1 else f"{nodes[0].name}..{nodes[-1].name}"


def _consumers(ops: list[list[onnx.NodeProto]]) -> dict[str, set[int]]:
    """For every tensor, the operators that read it."""
    consumers: dict[str, set[int]] = {}
    for g, nodes in enumerate(ops):
        for node in nodes:
            for name in reads(node):
                consumers.setdefault(name, set()).add(g)
    return consumers


def _attach_views(kept: list[tuple[tuple[str, ...], str]], by_name: dict[str, onnx.NodeProto],
                  graph_outputs: set[str]) -> list[tuple[tuple[str, ...], str]]:
    """Each operator that is one view node (a Reshape, Squeeze... whose output shares its input's buffer in
    onnxruntime) joins the operator producing that input, when everything else it reads is ready there: the two
    tensors are one buffer, which lives until the last reader of either, so they are kept and freed as one."""
    merged: list[tuple[list[str], str]] = []
    producer: dict[str, int] = {}
    for names, role in kept:
        node = by_name[names[0]]
        target = producer.get(node.input[0]) if len(names) == 1 and shared_buffers([node], graph_outputs) else None
        if target is not None and any(producer.get(name, -1) > target for name in reads(node)):
            target = None
        if target is None:
            merged.append((list(names), role))
            target = len(merged) - 1
        else:
            merged[target][0].append(names[0])
        producer.update((out, target) for name in names for out in by_name[name].output if out)
    return [(tuple(names), role) for names, role in merged]


def _buffer_bytes(nodes: list[onnx.NodeProto], exported: list[str], infos: dict[str, TensorInfo],
                  graph_outputs: set[str], resident: set[str]) -> int:
    """Bytes of the buffers behind a group's exported tensors: a view and the tensor it shares count once, and a
    view of a resident tensor (a graph input, a weight) counts nothing."""
    owner = shared_buffers(nodes, graph_outputs)
    buffers = {owner.get(name, name) for name in exported} - resident
    return sum(infos[name].nbytes for name in buffers if name in infos)


def _group_workspace(
    nodes: list[onnx.NodeProto],
    exported: set[str],
    exported_bytes: int,
    infos: dict[str, TensorInfo],
    workspace: NodeWorkspace,
    graph_outputs: set[str],
) -> int:
    """Transient memory of a group beyond its output, which the problem holds for the whole step: the peak,
    over its nodes, of internal tensors while live plus the outputs written so far plus the node's scratch,
    less the whole output. A tensor in another's buffer (a reshape) takes none and keeps that buffer alive."""
    owner = shared_buffers(nodes, graph_outputs)
    last_use: dict[str, int] = {}
    for k, node in enumerate(nodes):
        for name in reads(node):
            last_use[owner.get(name, name)] = k
    output_buffers = {owner.get(name, name) for name in exported}
    live: dict[str, int] = {}
    written = peak = 0
    for k, node in enumerate(nodes):
        for out in node.output:
            size = infos[out].nbytes if out in infos else 0
            if not out or out in owner:
                continue
            if out in output_buffers:
                written += size
            else:
                live[out] = size
        peak = max(peak, sum(live.values()) + written + workspace(node, infos))
        for name in [n for n in live if last_use.get(n, -1) <= k]:
            del live[name]
    return max(0, peak - exported_bytes)


def _constant_tensors(graph: onnx.GraphProto) -> set[str]:
    """Initializers and the outputs of nodes computed from initializers alone (never from graph inputs)."""
    known = {init.name for init in graph.initializer}
    for node in graph.node:
        if _is_constant_node(node, known):
            known.update(o for o in node.output if o)
    return known


def _is_constant_node(node: onnx.NodeProto, constants: set[str]) -> bool:
    """A node whose every input is constant: it runs once up front and its output stays resident."""
    return all(not name or name in constants for name in node.input)
