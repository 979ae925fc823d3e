"""The shape of a gradient rule: forward node and output gradients in, input gradients out."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx_ir as ir

from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.reads import outer_uses

# dys[j]: gradient of output j (for a rule using only the first output, that one; the builder gives zeros for an
# output no gradient reaches); needs[i]: operand i (`Rule.operands`) wants a gradient; keys of the result: operands.
GradFn = Callable[[Emitter, ir.Node, Sequence[ir.Value], Sequence[bool]], dict[int, ir.Value]]


@dataclass(frozen=True)
class Rule:
    """A gradient function and the input positions it differentiates (others are constants to it)."""

    fn: GradFn
    inputs: tuple[int, ...] | None = (0,)  # None: every input
    outputs: int | None = 1  # how many leading outputs' gradients it uses; None: all
    computed_only: tuple[int, ...] = ()
    """Input positions differentiated only when a node computes them: an initializer there is a constant, not a
    parameter (Clip's bounds: ReLU6's 0 and 6 are constants, a clamp by a tensor computed from weights is not)."""
    outer_reads: bool = False
    """Whether the operands are the outer tensors the node's subgraphs read, each once in order of first read (an
    If's branches read what they differentiate; its one input, the condition, gets no gradient), not its inputs."""

    def operands(self, node: ir.Node) -> list[ir.Value | None]:
        """What the rule differentiates, by position."""
        if self.outer_reads:
            return list(dict.fromkeys(value for _, _, value in outer_uses(node)))
        return list(node.inputs)

    def differentiates(self, position: int, value: ir.Value) -> bool:
        """Whether the rule gives a gradient for `value`, the input at `position`."""
        if position in self.computed_only and value.producer() is None:
            return False
        return self.inputs is None or position in self.inputs


def no_gradient(e: Emitter, node: ir.Node, dys: Sequence[ir.Value], needs: Sequence[bool]) -> dict[int, ir.Value]:
    """An op whose output passes no gradient to its inputs (differentiates no input, so it is never called)."""
    return {}


NO_GRADIENT = Rule(no_gradient, ())
"""The rule of ops whose inputs get no gradient from them, as in torch: piecewise-constant ones (zero slope almost
everywhere), random draws, and ops that read only their input's shape. A parameter reaching the loss only through
them is not trained, and the integer-path check does not count such a path."""
