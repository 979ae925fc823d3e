"""Turn a shape-inferred ONNX graph into the solver's Problem and the OpMap back to nodes.

Each node is one operator, except nodes whose inputs are all constant (Constant nodes and
plumbing fed only by initializers): those run once up front and their outputs stay resident.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx
from onnx_remat.passes.sizes import TensorInfo

from onnx_remat.opmap import OpMap
from onnx_remat.problem import Problem

NodeCost = Callable[[onnx.NodeProto, dict[str, TensorInfo]], float]
NodeWorkspace = Callable[[onnx.NodeProto, dict[str, TensorInfo]], int]


@dataclass(frozen=True)
class GraphProblem:
    """The problem for a graph and the nodes behind each operator."""

    problem: Problem
    opmap: OpMap


def build_problem(
    model: onnx.ModelProto,
    infos: dict[str, TensorInfo],
    device_costs: dict[str, NodeCost],
    workspace: NodeWorkspace,
    budgets: dict[str, int] | None = None,
) -> GraphProblem:
    """Operators, edges, sizes and per-device costs of `model` (nodes in the model's topological order)."""
    graph = model.graph
    constants = _constant_tensors(graph)
    prelude = [node for node in graph.node if _is_constant_node(node, constants)]
    op_nodes = [node for node in graph.node if not _is_constant_node(node, constants)]
    producer = {out: index for index, node in enumerate(op_nodes) for out in node.output if out}
    edges = sorted({(producer[i], v) for v, node in enumerate(op_nodes) for i in node.input if i in producer})
    outputs = {o.name for o in graph.output}
    devices = tuple(device_costs)
    inputs = {i.name for i in graph.input}
    resident = sum(infos[name].nbytes for name in constants | inputs if name in infos)
    return GraphProblem(
        problem=Problem(
            op_names=tuple(node.name for node in op_nodes),
            edges=tuple(edges),
            output_bytes=tuple(sum(infos[o].nbytes for o in node.output if o) for node in op_nodes),
            cost=tuple(tuple(cost(node, infos) for node in op_nodes) for cost in device_costs.values()),
            resident_bytes=(resident,) * len(devices),
            budgets=tuple((budgets or {}).get(d, 0) for d in devices),
            graph_outputs=tuple(sorted({producer[o] for o in outputs if o in producer})),
            devices=devices,
            workspace_bytes=tuple(workspace(node, infos) for node in op_nodes),
            copy_seconds_per_byte=tuple((0.0,) * len(devices) for _ in devices),
        ),
        opmap=OpMap(tuple((node.name,) for node in op_nodes), tuple(node.name for node in prelude)),
    )


def _constant_tensors(graph: onnx.GraphProto) -> set[str]:
    """Initializers and the outputs of nodes computed from initializers alone (never from graph inputs)."""
    known = {init.name for init in graph.initializer}
    for node in graph.node:
        if all(not name or name in known for name in node.input):
            known.update(o for o in node.output if o)
    return known


def _is_constant_node(node: onnx.NodeProto, constants: set[str]) -> bool:
    """A node whose every input is constant: it runs once up front and its output stays resident."""
    return all(not name or name in constants for name in node.input)
