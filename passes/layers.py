"""Group a training graph's nodes into the solver's operators: each forward node, and each one's gradient.

This is the paper's T = 2N: the solver schedules layers, not the several standard ops a gradient
takes; the rewrite expands a recomputed group back into its nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx


def training_groups(model: onnx.ModelProto, backward_groups: Mapping[str, Sequence[str]]) -> list[tuple[str, ...]]:
    """Operators for `model`: forward nodes alone, gradient nodes grouped by the forward node they
    differentiate, other nodes alone; ordered by each group's first node in the graph."""
    owner = {name: f"{forward}.grad" for forward, names in backward_groups.items() for name in names}
    members: dict[str, list[str]] = {}
    for node in model.graph.node:
        members.setdefault(owner.get(node.name, node.name), []).append(node.name)
    groups = [tuple(names) for names in members.values()]
    _check_topological(model, groups)
    return groups


def _check_topological(model: onnx.ModelProto, groups: list[tuple[str, ...]]) -> None:
    """Every tensor a group reads must come from an earlier group (or be constant)."""
    index = {name: g for g, names in enumerate(groups) for name in names}
    producer = {out: index[node.name] for node in model.graph.node if node.name in index for out in node.output}
    for node in model.graph.node:
        for name in node.input:
            if name in producer and node.name in index and producer[name] > index[node.name]:
                raise AssertionError(f"node {node.name} reads {name} from a later group: the grouping is not acyclic")


def group_roles(groups: Sequence[Sequence[str]], backward_groups: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """`backward` for a group of gradient nodes, `forward` for the rest."""
    backward = {name for names in backward_groups.values() for name in names}
    return tuple("backward" if group[0] in backward else "forward" for group in groups)
