"""Which nodes draw random values: a second run of one draws other values, so its operator is computed once.

A recomputed Dropout in training mode would draw a new mask, and the gradient read from the recomputation would
disagree with the forward output the first computation gave (issue 12). Random nodes inside an If, Loop or Scan
make their owner random.
"""

from __future__ import annotations

import onnx_ir as ir

from onnx_remat.passes.operator_groups import subgraphs
from onnx_remat.passes.reads import constant_value

RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial"}
)
"""Standard ops that draw random values whatever their inputs."""


def draws_random(node: ir.Node) -> bool:
    """Whether `node`, or a node in its subgraphs at any depth, draws random values."""
    inner = (sub_node for sub in subgraphs(node) for sub_node in ir.traversal.RecursiveGraphIterator(sub))
    return _random(node) or any(_random(sub_node) for sub_node in inner)


def _random(node: ir.Node) -> bool:
    """A standard random op, or a Dropout given a training_mode that is not a constant false."""
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "Dropout":
        training = node.inputs[2] if len(node.inputs) > 2 else None
        constant = constant_value(training)
        return training is not None and (constant is None or bool(constant.any()))
    return node.op_type in RANDOM_OPS
