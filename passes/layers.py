"""Group a training graph's nodes into the solver's operators: each forward node, and each one's gradient.

This is the paper's T = 2N: the solver schedules layers, not the several standard ops a gradient
takes; the rewrite expands a recomputed group back into its nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx

from onnx_remat.passes.reads import reads, rename_outer_reads


def training_groups(model: onnx.ModelProto, backward_groups: Mapping[str, Sequence[str]]) -> list[tuple[str, ...]]:
    """Operators for `model`: forward nodes alone, gradient nodes grouped by the forward node they
    differentiate and split by the tensors they hand on (see `_split_by_exports`), other nodes alone; ordered by
    each group's first node in the graph."""
    owner = {name: f"{forward}.grad" for forward, names in backward_groups.items() for name in names}
    members: dict[str, list[str]] = {}
    for node in model.graph.node:
        members.setdefault(owner.get(node.name, node.name), []).append(node.name)
    nodes = {node.name: node for node in model.graph.node}
    readers: dict[str, set[str]] = {}
    for node in model.graph.node:
        for name in reads(node):
            readers.setdefault(name, set()).add(node.name)
    for output in model.graph.output:
        readers.setdefault(output.name, set()).add("")
    groups = [part for names in members.values() for part in _split_by_exports([nodes[n] for n in names], readers)]
    _check_topological(model, groups)
    return groups


def _split_by_exports(group: list[onnx.NodeProto], readers: Mapping[str, set[str]]) -> list[tuple[str, ...]]:
    """`group` split so that nodes serving different sets of the tensors it hands on (read outside it) are
    different operators: the gradients of a Mul for its two inputs are read at different times, and one operator
    would hold both until the later reader (GPT training's minimum came out 12% above what it needs). Nodes
    serving several hand-ons go first; the order keeps every part after the parts it reads."""
    inside = {node.name for node in group}
    serves: dict[str, frozenset[str]] = {}
    for node in reversed(group):
        handed_on = {name for name in node.output if name and readers.get(name, set()) - inside}
        for name in node.output:
            for reader in readers.get(name, set()) & inside:
                handed_on |= serves[reader]
        serves[node.name] = frozenset(handed_on)
    widest = max(serves.values(), key=len)
    parts: dict[frozenset[str], list[str]] = {}
    for node in group:
        parts.setdefault(serves[node.name] or widest, []).append(node.name)
    return [tuple(names) for _, names in sorted(parts.items(), key=lambda item: -len(item[0]))]


def _check_topological(model: onnx.ModelProto, groups: list[tuple[str, ...]]) -> None:
    """Every tensor a group reads must come from an earlier group (or be constant)."""
    index = {name: g for g, names in enumerate(groups) for name in names}
    producer = {out: index[node.name] for node in model.graph.node if node.name in index for out in node.output}
    for node in model.graph.node:
        for name in reads(node):
            if name in producer and node.name in index and producer[name] > index[node.name]:
                raise AssertionError(f"node {node.name} reads {name} from a later group: the grouping is not acyclic")


def group_roles(groups: Sequence[Sequence[str]], backward_groups: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """`backward` for a group of gradient nodes, `forward` for the rest."""
    backward = {name for names in backward_groups.values() for name in names}
    return tuple("backward" if group[0] in backward else "forward" for group in groups)


def separate_graph_outputs(
    model: onnx.ModelProto, groups: list[tuple[str, ...]], roles: tuple[str, ...]
) -> tuple[list[tuple[str, ...]], tuple[str, ...]]:
    """Give each graph output that a group exports beside other tensors an Identity of its own.

    The solver holds an operator's whole output to the end when any of it is a graph output; a
    gradient group exports both a parameter's gradient (held) and the activation gradient (not), and a
    training BatchNorm exports its running statistics with its activation. The Identity lets the large
    part go. Edits `model` in place; returns the new groups and roles.
    """
    graph_outputs = {o.name for o in model.graph.output}
    group_of = {name: g for g, names in enumerate(groups) for name in names}
    readers: dict[str, set[int]] = {}
    for node in model.graph.node:
        for name in reads(node):
            readers.setdefault(name, set()).add(group_of[node.name])
    by_name = {node.name: node for node in model.graph.node}
    new_groups, new_roles, order = [], [], []
    for g, names in enumerate(groups):
        new_groups.append(names)
        new_roles.append(roles[g])
        order.extend(by_name[n] for n in names)
        outputs = [o for n in names for o in by_name[n].output if o]
        exported = [o for o in outputs if readers.get(o, set()) - {g} or o in graph_outputs]
        if all(o in graph_outputs for o in exported):
            continue
        for output in [o for o in exported if o in graph_outputs]:
            identity = _rename_output(by_name, names, output)
            order.append(identity)
            new_groups.append((identity.name,))
            new_roles.append(roles[g])
    del model.graph.node[:]
    model.graph.node.extend(order)
    return new_groups, tuple(new_roles)


def _rename_output(by_name: dict[str, onnx.NodeProto], names: tuple[str, ...], output: str) -> onnx.NodeProto:
    """Let the group write `output` under a new name and return an Identity restoring the graph output."""
    value = f"{output}__value"
    for name in names:
        node = by_name[name]
        node.output[:] = [value if o == output else o for o in node.output]
        node.input[:] = [value if i == output else i for i in node.input]
        rename_outer_reads(node, lambda i: value if i == output else i)
    return onnx.helper.make_node("Identity", [value], [output], name=f"{output}__out")
