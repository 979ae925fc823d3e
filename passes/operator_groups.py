"""Group a training graph's nodes into the solver's operators: each forward node, and each one's gradient.

This is the paper's T = 2N: the solver schedules layers, not the several standard ops a gradient
takes; the rewrite expands a recomputed group back into its nodes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import onnx_ir as ir

from onnx_remat.passes.manager import named, run_passes

Groups = list[tuple[str, ...]]


def group_training_graph(
    model: ir.Model, backward_groups: Mapping[str, Sequence[str]]
) -> tuple[Groups, tuple[str, ...]]:
    """Separate each exported graph output of the training graph, in place (`SeparateGraphOutputs`); its operator
    groups (`training_groups`) and their roles (`group_roles`)."""
    groups = training_groups(model.graph, backward_groups)
    separate = SeparateGraphOutputs(groups, group_roles(groups, backward_groups))
    run_passes(model, [separate])
    return separate.groups, separate.roles


def training_groups(graph: ir.Graph, backward_groups: Mapping[str, Sequence[str]]) -> Groups:
    """Operators for `graph`: forward nodes alone, gradient nodes grouped by the forward node they
    differentiate and split by the tensors they hand on (see `_split_by_exports`), other nodes alone; ordered by
    each group's first node in the graph."""
    owner = {name: f"{forward}.grad" for forward, names in backward_groups.items() for name in names}
    members: dict[str, list[ir.Node]] = {}
    for node in graph:
        members.setdefault(owner.get(named(node), named(node)), []).append(node)
    owners = subgraph_owners(graph)
    return [part for nodes in members.values() for part in _split_by_exports(nodes, graph, owners)]


def _split_by_exports(group: list[ir.Node], graph: ir.Graph, owners: dict[ir.Graph, ir.Node]) -> Groups:
    """`group` split so that nodes serving different sets of the tensors it hands on (read outside it or graph
    outputs) are different operators: the gradients of a Mul for its two inputs are read at different times, and
    one operator would hold both until the later reader (GPT training's minimum came out 12% above what it needs).
    Nodes serving several hand-ons go first; the order keeps every part after the parts it reads."""
    inside = set(group)
    serves: dict[ir.Node, frozenset[str]] = {}
    for node in reversed(group):
        handed_on: set[str] = set()
        for value in node.outputs:
            users = readers(value, graph, owners)
            if value.name and (value.is_graph_output() or users - inside):
                handed_on.add(value.name)
            for reader in users & inside:
                handed_on |= serves[reader]
        serves[node] = frozenset(handed_on)
    widest = max(serves.values(), key=len)
    parts: dict[frozenset[str], list[str]] = {}
    for node in group:
        parts.setdefault(serves[node] or widest, []).append(named(node))
    return [tuple(names) for _, names in sorted(parts.items(), key=lambda item: -len(item[0]))]


def check_topological(graph: ir.Graph, groups: Sequence[Sequence[str]]) -> None:
    """Every tensor a group reads must come from an earlier group (or be constant)."""
    index = {name: g for g, names in enumerate(groups) for name in names}
    owners = subgraph_owners(graph)
    for node in graph:
        for value in node.outputs:
            for reader in readers(value, graph, owners):
                if index[named(reader)] < index[named(node)]:
                    raise AssertionError(f"node {reader.name} reads {value.name} from a later group: the grouping "
                                         "is not acyclic")


def group_roles(groups: Sequence[Sequence[str]], backward_groups: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """`backward` for a group of gradient nodes, `forward` for the rest."""
    backward = {name for names in backward_groups.values() for name in names}
    return tuple("backward" if group[0] in backward else "forward" for group in groups)


class SeparateGraphOutputs(ir.passes.InPlacePass):
    """Give each graph output that a group exports beside other tensors an Identity of its own, in a group of its
    own right after it; the nodes are put in group order. `groups` and `roles` are the new ones after the call.

    The solver holds an operator's whole output to the end when any of it is a graph output; a
    gradient group exports both a parameter's gradient (held) and the activation gradient (not), and a
    training BatchNorm exports its running statistics with its activation. The Identity lets the large
    part go. Requires the groups to be topologically ordered; ensures they cover every node exactly once.
    """

    def __init__(self, groups: Groups, roles: tuple[str, ...]):
        super().__init__()
        self.groups = groups
        self.roles = roles

    def requires(self, model: ir.Model) -> None:
        check_topological(model.graph, self.groups)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        owners = subgraph_owners(graph)
        by_name = {node.name: node for node in graph}
        groups, roles, order = [], [], []
        for names, role in zip(self.groups, self.roles, strict=True):
            nodes = [by_name[name] for name in names]
            groups.append(names)
            roles.append(role)
            order.extend(nodes)
            outputs = [value for node in nodes for value in node.outputs if value.name]
            exported = [v for v in outputs if v.is_graph_output() or readers(v, graph, owners) - set(nodes)]
            if all(v.is_graph_output() for v in exported):
                continue
            for value in [v for v in exported if v.is_graph_output()]:
                identity = _separate(graph, value, set(nodes), owners)
                order.append(identity)
                groups.append((named(identity),))
                roles.append(role)
        modified = order != list(graph)
        graph.remove(list(graph))
        graph.extend(order)
        self.groups, self.roles = groups, tuple(roles)
        return ir.passes.PassResult(model, modified)

    def ensures(self, model: ir.Model) -> None:
        grouped = sorted(name for names in self.groups for name in names)
        if grouped != sorted(named(node) for node in model.graph):
            raise ValueError("the groups do not cover every node exactly once")


def _separate(graph: ir.Graph, value: ir.Value, group: set[ir.Node], owners: dict[ir.Graph, ir.Node]) -> ir.Node:
    """Let the group write graph output `value` under a new name, and return an Identity (not yet in the graph)
    restoring the graph output under its name for the graph and the readers outside the group."""
    outside = [(user, index) for user, index in value.uses() if _top(user, graph, owners) not in group]
    name = value.name
    identity = ir.Node("", "Identity", [value], name=f"{name}__out", num_outputs=1)
    restored = identity.outputs[0]
    restored.type, restored.shape = value.type, value.shape
    for user, index in outside:
        user.replace_input_with(index, restored)
    for k, output in enumerate(graph.outputs):
        if output is value:
            graph.outputs[k] = restored
    value.name = f"{name}__value"
    restored.name = name
    return identity


def readers(value: ir.Value, graph: ir.Graph, owners: dict[ir.Graph, ir.Node]) -> set[ir.Node]:
    """The nodes of `graph` reading `value`, a read inside a subgraph (If, Loop, Scan) counted as its owner's."""
    return {_top(user, graph, owners) for user, _ in value.uses()}


def _top(node: ir.Node, graph: ir.Graph, owners: dict[ir.Graph, ir.Node]) -> ir.Node:
    """`node` if it is in `graph`, else the node of `graph` whose subgraph holds it."""
    if node.graph is graph:
        return node
    if node.graph is None:
        raise ValueError(f"node {node.name!r} is in no graph")
    return owners[node.graph]


def subgraph_owners(graph: ir.Graph) -> dict[ir.Graph, ir.Node]:
    """For every subgraph at any depth under `graph`'s nodes, the node of `graph` it belongs to."""
    owners: dict[ir.Graph, ir.Node] = {}
    for node in graph:
        for sub in subgraphs(node):
            owners[sub] = node
            for inner in ir.traversal.RecursiveGraphIterator(sub):
                owners.update(dict.fromkeys(subgraphs(inner), node))
    return owners


def subgraphs(node: ir.Node) -> Iterator[ir.Graph]:
    """The graphs `node`'s attributes hold (an If's branches, a Loop's or Scan's body)."""
    for attribute in node.attributes.values():
        if attribute.type == ir.AttributeType.GRAPH:
            yield attribute.as_graph()
        elif attribute.type == ir.AttributeType.GRAPHS:
            yield from attribute.as_graphs()
