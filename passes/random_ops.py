"""Which nodes draw random values: a second run of one draws other values, so its operator is computed once.

A recomputed Dropout in training mode would draw a new mask, and the gradient read from the recomputation would
disagree with the forward output the first computation gave (issue 12). Random nodes inside an If, Loop or Scan
make their owner random.
"""

from __future__ import annotations

import onnx_ir as ir

from onnx_remat.passes.operator_groups import subgraphs

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
        return training is not None and not _constant_false(training)
    return node.op_type in RANDOM_OPS


def _constant_false(value: ir.Value) -> bool:
    """Whether `value` is known to be false: an initializer or a Constant node's output holding false."""
    tensor = value.const_value
    producer = value.producer()
    constant_node = producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx")
    if tensor is None and producer is not None and constant_node:
        attribute = producer.attributes.get("value")
        tensor = None if attribute is None else attribute.as_tensor()
    return tensor is not None and not tensor.numpy().any()
