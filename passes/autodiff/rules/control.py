"""If's gradient (torch.cond as the dynamo exporter writes it): an If on the same condition whose branches hold each
branch's backward, differentiated by the same rules (a nested If by this one), and give the gradients of every outer
tensor either branch reads (zeros from a branch that does not read it).

A branch's forward intermediates are recomputed inside its backward branch, not exported as extra outputs: the
forward If keeps nothing beyond its outputs, and everything the scheduler sees of either If (its inputs, the outer
tensors its branches read, its outputs) is what either branch needs, as for an If in inference; what a branch holds
while it runs stays inside its node. Exported intermediates would have to be the union of both branches' (the
branch not taken giving zeros, as If's branches give alike outputs), bytes the schedule pays whichever branch runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import present
from onnx_remat.passes.autodiff.reverse import backpropagate
from onnx_remat.passes.autodiff.rules.base import Rule
from onnx_remat.passes.reads import is_read

BRANCHES = ("then_branch", "else_branch")


def if_rule(rules: Mapping[str, Rule]) -> Rule:
    """The rule of If, differentiating its branches by `rules` (the registry it joins)."""

    def if_(e: Emitter, node: ir.Node, dys: Sequence[ir.Value], needs: Sequence[bool]) -> dict[int, ir.Value]:
        operands = rule.operands(node)
        positions = [pos for pos, need in enumerate(needs) if need]
        wanted = [present(operands[pos]) for pos in positions]
        branches = {name: node.attributes[name].as_graph() for name in BRANCHES}
        _refuse_unequal_shapes(node, *branches.values())
        backward = {name: _backward_branch(rules, e, node, branch, dys, wanted) for name, branch in branches.items()}
        grads = e.ops("If", [node.inputs[0]], len(wanted), **backward)
        return dict(zip(positions, grads, strict=True))

    rule = Rule(if_, None, outputs=None, outer_reads=True)  # if_ reads its operands through it
    return rule


def _refuse_unequal_shapes(node: ir.Node, then_branch: ir.Graph, else_branch: ir.Graph) -> None:
    """ModelError unless both branches give every output one static shape, as the branches declare it (the schedule
    sizes each tensor once; a shape that depends on the data, or on which branch runs, has none)."""
    for then_out, else_out in zip(then_branch.outputs, else_branch.outputs, strict=True):
        shapes = [value.shape for value in (then_out, else_out)]
        if any(shape is None or not shape.is_static() for shape in shapes) or shapes[0] != shapes[1]:
            raise ModelError(f"If {node.name!r}: its branches give outputs of unequal or unknown shapes "
                             f"({shapes[0]} and {shapes[1]}): training needs one static shape for both branches")


def _backward_branch(rules: Mapping[str, Rule], e: Emitter, node: ir.Node, branch: ir.Graph,
                     dys: Sequence[ir.Value], wanted: Sequence[ir.Value]) -> ir.Graph:
    """`branch` recomputed, then its backward from the If's output gradients `dys` (read from the outer graph), giving
    the gradient of each of `wanted` (zeros where none reaches it); nodes of the recomputation the backward does not
    read are left out."""
    graph = branch.clone(allow_outer_scope_values=True)
    graph.name = e.names.fresh(f"{e.prefix}/{branch.name or 'branch'}")
    _rename(graph, e)
    sink: list[ir.Node] = []
    inner = Emitter(e.info, e.names, e.owner, sink, e.dtype)
    where = f" inside If {node.name!r}"
    grads = backpropagate(rules, inner, list(graph), list(zip(graph.outputs, dys, strict=True)), wanted, where)
    outputs = [_zeros(inner, value) if grad is None else grad for grad, value in zip(grads, wanted, strict=True)]
    outputs = _own_outputs(inner, graph, outputs)
    graph.extend(sink)
    for output, value in zip(outputs, wanted, strict=True):
        output.dtype, output.shape = e.info.dtype(value), ir.Shape(e.info.shape(value))
    graph.outputs.clear()
    graph.outputs.extend(outputs)
    for recomputed in reversed(list(graph)):
        if not any(is_read(output) for output in recomputed.outputs):
            graph.remove(recomputed, safe=True)
    return graph


def _rename(graph: ir.Graph, e: Emitter) -> None:
    """Give the cloned nodes and their outputs (nested subgraphs' too) fresh names, so no name repeats the forward
    branch's."""
    for copied in graph.all_nodes():
        copied.name = e.names.fresh(f"{e.prefix}/recompute")
        for j, output in enumerate(copied.outputs):
            output.name = copied.name if len(copied.outputs) == 1 else f"{copied.name}:{j}"


def _own_outputs(e: Emitter, graph: ir.Graph, outputs: Sequence[ir.Value]) -> list[ir.Value]:
    """`outputs`, each through an Identity where the branch does not compute it (an outer tensor, the If's output
    gradient passed on as it is) or gives it already: a graph's outputs are its own distinct values."""
    inside = {*graph, *e.sink}
    own: list[ir.Value] = []
    for value in outputs:
        own.append(value if value.producer() in inside and value not in own else e.op("Identity", value))
    return own


def _zeros(e: Emitter, value: ir.Value) -> ir.Value:
    """Zeros of `value`'s shape and element type: the gradient from a branch that does not read it."""
    zero = ir.tensor(np.zeros(1, dtype=e.info.np_dtype(value)))
    return e.op("ConstantOfShape", e.ints(e.info.shape(value)), value=zero)
