"""Reverse-mode accumulation, shared by the training step's backward pass and an If's branches: each forward node's
rule turns its outputs' summed gradients into contributions to the values it differentiates."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import onnx_ir as ir

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import GraphInfo
from onnx_remat.passes.reads import value_reads

if TYPE_CHECKING:  # the rules' package imports this module for If's rule
    from onnx_remat.passes.autodiff.rules.base import Rule

STANDARD_DOMAINS = ("", "ai.onnx")


def differentiated_reads(rules: Mapping[str, Rule], node: ir.Node) -> list[ir.Value]:
    """The values whose numbers the node's output depends on: the operands its rule differentiates, or every value
    it reads where it has no rule."""
    rule = rules.get(node.op_type)
    if rule is None:
        return value_reads(node)
    return [i for pos, i in enumerate(rule.operands(node)) if i is not None and rule.differentiates(pos, i)]


def requiring(rules: Mapping[str, Rule], info: GraphInfo, nodes: Sequence[ir.Node],
              sources: set[ir.Value]) -> set[ir.Value]:
    """`sources` and every float tensor of `nodes` that depends on one of them through differentiated reads."""
    requires = set(sources)
    for node in nodes:
        if any(value in requires for value in differentiated_reads(rules, node)):
            requires |= {o for o in node.outputs if o.name and info.is_float(o)}
    return requires


def ruleless(rules: Mapping[str, Rule], node: ir.Node) -> str | None:
    """The op type (domain-qualified outside the standard one) of a node without a gradient rule, else None."""
    if node.domain in STANDARD_DOMAINS:
        return None if node.op_type in rules else node.op_type
    return f"{node.domain}.{node.op_type}"


def refuse_ruleless(missing: Mapping[str, str], where: str = "") -> None:
    """ModelError naming each op type without a rule and a node of it (`missing`: op type -> node name)."""
    if missing:
        listed = "; ".join(f"{op} (e.g. node {name!r}{where})" for op, name in sorted(missing.items()))
        raise ModelError(f"no gradient rule for these op types: {listed}")


class Reverse:
    """Gradient contributions per tensor, summed when the tensor's producer is differentiated."""

    def __init__(self, rules: Mapping[str, Rule], info: GraphInfo, requires: set[ir.Value] | frozenset[ir.Value]):
        self.rules = rules
        self.info = info
        self.requires = requires
        self.partial: dict[ir.Value, list[ir.Value]] = defaultdict(list)  # tensor -> gradient contributions
        self.handed: dict[ir.Value, int] = defaultdict(int)  # gradient tensor -> times handed out as a contribution

    def carrying(self, node: ir.Node) -> list[ir.Value]:
        """The node's outputs a gradient has reached so far."""
        return [o for o in node.outputs if o.name and self.partial.get(o)]

    def contribute(self, tensor: ir.Value, grad: ir.Value) -> None:
        """Add `grad` to the gradient of `tensor`."""
        self.partial[tensor].append(grad)
        self.handed[grad] += 1

    def total(self, e: Emitter, tensor: ir.Value) -> ir.Value | None:
        """The summed gradient of `tensor` (None if nothing reached it)."""
        parts = self.partial.pop(tensor, [])
        if len(parts) > 1:
            return e.op("Sum", *parts)
        return parts[0] if parts else None

    def differentiate(self, e: Emitter, node: ir.Node) -> None:
        """Emit the node's gradient through its rule and hand its operands their contributions."""
        rule = self.rules[node.op_type]
        dys = self._output_grads(e, node, rule)
        operands = rule.operands(node)
        needs = [i is not None and i in self.requires and rule.differentiates(pos, i)
                 for pos, i in enumerate(operands)]
        for pos, grad in rule.fn(e, node, dys, needs).items():
            value = operands[pos]
            if needs[pos] and value is not None:
                self.contribute(value, grad)

    def _output_grads(self, e: Emitter, node: ir.Node, rule: Rule) -> list[ir.Value]:
        """The summed gradients of the outputs the rule uses (zeros for one no gradient reached); ModelError if the
        loss depends on an output the rule does not use."""
        dys = [self.total(e, o) if o.name else None for o in node.outputs]
        if rule.outputs is not None and any(dy is not None for dy in dys[rule.outputs:]):
            raise ModelError(f"{node.op_type} {node.name!r}: the loss depends on an output whose gradient "
                             f"is not supported (only the first {rule.outputs})")
        used = dys if rule.outputs is None else dys[: rule.outputs]
        return [dy if dy is not None else e.zeros(self.info.shape(out))
                for dy, out in zip(used, node.outputs, strict=False)]


def backpropagate(rules: Mapping[str, Rule], e: Emitter, nodes: Sequence[ir.Node],
                  seeds: Sequence[tuple[ir.Value, ir.Value]], wanted: Sequence[ir.Value],
                  where: str) -> list[ir.Value | None]:
    """The gradients of `wanted` (None where none reaches it) given the gradients `seeds` (tensor, its gradient) of
    tensors `nodes` compute, emitting the backward of `nodes` through `e`; ModelError for a node on the way without
    a rule (`where` says where the nodes are, for the message)."""
    requires = requiring(rules, e.info, nodes, set(wanted))
    reverse = Reverse(rules, e.info, requires)
    for tensor, grad in seeds:
        if tensor in requires:
            reverse.contribute(tensor, grad)
    missing: dict[str, str] = {}
    for node in reversed(nodes):
        if not reverse.carrying(node):
            continue
        op = ruleless(rules, node)
        if op is not None:
            missing.setdefault(op, node.name or "")
            continue
        reverse.differentiate(e, node)
    refuse_ruleless(missing, where)
    return [reverse.total(e, value) for value in wanted]
