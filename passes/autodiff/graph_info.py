"""What the rules may ask about the forward graph: its nodes' attributes, and its values' static shapes, element
types and constant values (the shapes ResolveShapes set, passes/shapes.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.manager import named

FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


def has_attr(node: ir.Node, name: str) -> bool:
    """Whether the node sets the attribute."""
    return name in node.attributes


def _attr_value(node: ir.Node, name: str, default: object) -> Any:
    """The attribute's value, else `default`; ModelError if both are missing."""
    attr = node.attributes.get(name)
    if attr is not None:
        return attr.value
    if default is None:
        raise ModelError(f"{node.op_type} node {node.name!r} has no attribute {name!r}")
    return default


def attr_int(node: ir.Node, name: str, default: int | None = None) -> int:
    """An integer attribute, or `default` when the node does not set it."""
    return int(_attr_value(node, name, default))


def attr_float(node: ir.Node, name: str, default: float | None = None) -> float:
    """A float attribute, or `default` when the node does not set it."""
    return float(_attr_value(node, name, default))


def attr_ints(node: ir.Node, name: str, default: list[int] | None = None) -> list[int]:
    """An integer-list attribute, or `default` when the node does not set it."""
    return [int(v) for v in _attr_value(node, name, default)]


def attr_str(node: ir.Node, name: str, default: str | None = None) -> str:
    """A string attribute, or `default` when the node does not set it."""
    return str(_attr_value(node, name, default))


def attr_strs(node: ir.Node, name: str) -> list[str]:
    """A string-list attribute."""
    return [str(v) for v in _attr_value(node, name, None)]


def present(value: ir.Value | None) -> ir.Value:
    """`value`; ModelError if it is an omitted input a gradient needs."""
    if value is None:
        raise ModelError("a gradient needs an input the model omits: give the node that input explicitly")
    return value


class GraphInfo:
    """The model's opset, and static shapes, element types and constant values of its values."""

    def __init__(self, model: ir.Model) -> None:
        self.opset = next(version for domain, version in model.opset_imports.items() if domain in ("", "ai.onnx"))
        self.constants: dict[ir.Value, np.ndarray] = {}

    def dtype(self, value: ir.Value | None) -> ir.DataType:
        """The element type of a tensor."""
        value = present(value)
        if value.dtype is None:
            raise ModelError(f"tensor {value.name!r} has no type after shape inference: fix the input shapes")
        return value.dtype

    def np_dtype(self, value: ir.Value | None) -> np.dtype:
        """The numpy element type of a tensor."""
        return np.dtype(helper.tensor_dtype_to_np_dtype(self.dtype(value)))

    def is_float(self, value: ir.Value | None) -> bool:
        """Whether a tensor holds floating-point numbers (and so can carry a gradient)."""
        return value is not None and value.dtype in FLOAT_TYPES

    def shape(self, value: ir.Value | None) -> tuple[int, ...]:
        """The concrete static shape of a tensor; ModelError if shape inference left it unknown."""
        value = present(value)
        if value.shape is None or not value.shape.is_static():
            raise ModelError(f"tensor {value.name!r} has no static shape after shape inference: fix the input shapes")
        return tuple(value.shape.numpy())

    def static(self, value: ir.Value | None) -> np.ndarray:
        """The value of a tensor computable without any graph input (constants, shapes); else ModelError."""
        value = present(value)
        if value not in self.constants:
            self.constants[value] = self._fold(value)
        return self.constants[value]

    def _fold(self, value: ir.Value) -> np.ndarray:
        if value.const_value is not None:
            return value.const_value.numpy()
        node = value.producer()
        if node is None:
            raise ModelError(f"tensor {value.name!r} must be a constant for its gradient, but it depends on a graph "
                             "input")
        source = node.inputs[0] if node.inputs else None
        if node.op_type == "Shape" and source is not None:
            dims = np.array(self.shape(source), dtype=np.int64)
            return dims[attr_int(node, "start", 0) : attr_int(node, "end", len(dims))]
        feeds = {named(i): self.static(i) for i in node.inputs if i is not None}
        values = [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                  for i, v in feeds.items()]
        produced = [o for o in node.outputs if o.name]
        outputs = [helper.make_tensor_value_info(named(o), TensorProto.UNDEFINED, None) for o in produced]
        graph = helper.make_graph([ir.serde.serialize_node(node)], "fold", values, outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        for out, result in zip(produced, ReferenceEvaluator(model).run(None, feeds), strict=True):
            self.constants[out] = np.asarray(result)
        return self.constants[value]
