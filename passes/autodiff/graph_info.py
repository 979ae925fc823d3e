"""What the rules may ask about the forward graph: static shapes, element types, constant values."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_remat.errors import ModelError
from onnx_remat.passes.manager import named

FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16})


def has_attr(node: onnx.NodeProto, name: str) -> bool:
    """Whether the node sets the attribute."""
    return any(a.name == name for a in node.attribute)


def _attr_value(node: onnx.NodeProto, name: str, default: object) -> Any:
    """The attribute's value as onnx.helper decodes it, else `default`; ModelError if both are missing."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    if default is None:
        raise ModelError(f"{node.op_type} node {node.name!r} has no attribute {name!r}")
    return default


def attr_int(node: onnx.NodeProto, name: str, default: int | None = None) -> int:
    """An integer attribute, or `default` when the node does not set it."""
    return int(_attr_value(node, name, default))


def attr_float(node: onnx.NodeProto, name: str, default: float | None = None) -> float:
    """A float attribute, or `default` when the node does not set it."""
    return float(_attr_value(node, name, default))


def attr_ints(node: onnx.NodeProto, name: str, default: list[int] | None = None) -> list[int]:
    """An integer-list attribute, or `default` when the node does not set it."""
    return [int(v) for v in _attr_value(node, name, default)]


def attr_str(node: onnx.NodeProto, name: str, default: str | None = None) -> str:
    """A string attribute, decoded, or `default` when the node does not set it."""
    value = _attr_value(node, name, default)
    return value.decode() if isinstance(value, bytes) else str(value)


def attr_strs(node: onnx.NodeProto, name: str) -> list[str]:
    """A string-list attribute, decoded."""
    return [v.decode() if isinstance(v, bytes) else str(v) for v in _attr_value(node, name, None)]


class GraphInfo:
    """Static shapes and element types of every tensor of a model whose shapes are resolved (passes/shapes.py), read
    from its onnx-ir values by name, and constant folding."""

    def __init__(self, model: ir.Model) -> None:
        self.opset = next(version for domain, version in model.opset_imports.items() if domain in ("", "ai.onnx"))
        self.values = ir.convenience.create_value_mapping(model.graph)
        self.initializers = frozenset(model.graph.initializers)
        self.constants: dict[str, np.ndarray] = {}

    def dtype(self, name: str) -> int:
        """The element type (TensorProto enum) of a tensor."""
        dtype = self._value(name).dtype
        if dtype is None:
            raise ModelError(f"tensor {name!r} has no type after shape inference: fix the input shapes")
        return int(dtype)

    def np_dtype(self, name: str) -> np.dtype:
        """The numpy element type of a tensor."""
        return np.dtype(helper.tensor_dtype_to_np_dtype(self.dtype(name)))

    def is_float(self, name: str) -> bool:
        """Whether a tensor holds floating-point numbers (and so can carry a gradient)."""
        value = self.values.get(name)
        return value is not None and value.dtype is not None and int(value.dtype) in FLOAT_TYPES

    def shape(self, name: str) -> tuple[int, ...]:
        """The concrete static shape of a tensor; ModelError if shape inference left it unknown."""
        shape = self._value(name).shape
        if shape is None or not shape.is_static():
            raise ModelError(f"tensor {name!r} has no static shape after shape inference: fix the input shapes")
        return tuple(shape.numpy())

    def _value(self, name: str) -> ir.Value:
        if name not in self.values:
            raise ModelError(f"tensor {name!r} has no type after shape inference: fix the input shapes")
        return self.values[name]

    def static(self, name: str) -> np.ndarray:
        """The value of a tensor computable without any graph input (constants, shapes); else ModelError."""
        if name not in self.constants:
            self.constants[name] = self._fold(name)
        return self.constants[name]

    def _fold(self, name: str) -> np.ndarray:
        value = self._value(name)
        if value.const_value is not None:
            return value.const_value.numpy()
        node = value.producer()
        if node is None:
            raise ModelError(f"tensor {name!r} must be a constant for its gradient, but it depends on a graph input")
        source = node.inputs[0] if node.inputs else None
        if node.op_type == "Shape" and source is not None:
            dims = np.array(self.shape(named(source)), dtype=np.int64)
            return dims[node.attributes.get_int("start", 0) : node.attributes.get_int("end", len(dims))]
        feeds = {named(i): self.static(named(i)) for i in node.inputs if i is not None}
        values = [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                  for i, v in feeds.items()]
        outputs = [named(o) for o in node.outputs if o.name]
        graph = helper.make_graph([ir.serde.serialize_node(node)], "fold", values,
                                  [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        results = ReferenceEvaluator(model).run(None, feeds)
        for out, result in zip(outputs, results, strict=True):
            self.constants[out] = np.asarray(result)
        return self.constants[name]
