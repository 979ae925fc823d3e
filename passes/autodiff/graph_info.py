"""What the rules may ask about the forward graph: static shapes, element types, constant values."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_remat.errors import ModelError

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
    """Static shapes and element types of every tensor (after shape inference), and constant folding."""

    def __init__(self, model: onnx.ModelProto) -> None:
        graph = model.graph
        self.opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        self._types: dict[str, onnx.TypeProto] = {}
        for value in [*graph.input, *graph.value_info, *graph.output]:
            self._types[value.name] = value.type
        self.initializers = frozenset(i.name for i in graph.initializer)
        self.constants: dict[str, np.ndarray] = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
        for init in graph.initializer:
            self._types.setdefault(init.name, helper.make_tensor_type_proto(init.data_type, list(init.dims)))
        self.producer: dict[str, onnx.NodeProto] = {out: n for n in graph.node for out in n.output if out}

    def dtype(self, name: str) -> int:
        """The element type (TensorProto enum) of a tensor."""
        return self._type(name).tensor_type.elem_type

    def np_dtype(self, name: str) -> np.dtype:
        """The numpy element type of a tensor."""
        return np.dtype(helper.tensor_dtype_to_np_dtype(self.dtype(name)))

    def is_float(self, name: str) -> bool:
        """Whether a tensor holds floating-point numbers (and so can carry a gradient)."""
        return name in self._types and self.dtype(name) in FLOAT_TYPES

    def shape(self, name: str) -> tuple[int, ...]:
        """The concrete static shape of a tensor; ModelError if shape inference left it unknown."""
        tensor_type = self._type(name).tensor_type
        dims = tensor_type.shape.dim if tensor_type.HasField("shape") else None
        if dims is None or any(not d.HasField("dim_value") for d in dims):
            raise ModelError(f"tensor {name!r} has no static shape after shape inference: fix the input shapes")
        return tuple(d.dim_value for d in dims)

    def _type(self, name: str) -> onnx.TypeProto:
        if name not in self._types:
            raise ModelError(f"tensor {name!r} has no type after shape inference: fix the input shapes")
        return self._types[name]

    def static(self, name: str) -> np.ndarray:
        """The value of a tensor computable without any graph input (constants, shapes); else ModelError."""
        if name not in self.constants:
            self.constants[name] = self._fold(name)
        return self.constants[name]

    def _fold(self, name: str) -> np.ndarray:
        node = self.producer.get(name)
        if node is None:
            raise ModelError(f"tensor {name!r} must be a constant for its gradient, but it depends on a graph input")
        if node.op_type == "Shape":
            dims = np.array(self.shape(node.input[0]), dtype=np.int64)
            return dims[attr_int(node, "start", 0) : attr_int(node, "end", len(dims))]
        inputs = [i for i in node.input if i]
        feeds = {i: self.static(i) for i in inputs}
        values = [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                  for i, v in feeds.items()]
        outputs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in node.output if o]
        graph = helper.make_graph([node], "fold", values, outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        results = ReferenceEvaluator(model).run(None, feeds)
        for out, value in zip([o for o in node.output if o], results, strict=True):
            self.constants[out] = np.asarray(value)
        return self.constants[name]
