"""Shape, element type and byte size of every tensor of a model whose shapes are resolved."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's concrete shape and element type, and the bytes it occupies."""

    shape: tuple[int, ...]
    elem_type: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(helper.tensor_dtype_to_np_dtype(self.elem_type)).itemsize


def tensor_infos(model: ir.Model | onnx.ModelProto) -> dict[str, TensorInfo]:
    """Every named tensor of the main graph with a known concrete shape: initializers, inputs, node outputs, graph
    outputs, read from the IR's values. A ModelProto (a rewritten model, as the device runs and the memory
    measurement take it) is read into onnx-ir first."""
    graph = (ir.serde.deserialize_model(model) if isinstance(model, onnx.ModelProto) else model).graph
    infos = {name: TensorInfo(tuple(value.const_value.shape.numpy()), int(value.const_value.dtype))
             for name, value in graph.initializers.items() if value.const_value is not None}
    for value in [*graph.inputs, *(out for node in graph for out in node.outputs), *graph.outputs]:
        if value.name and is_concrete_value(value):
            infos.setdefault(value.name, TensorInfo(_dims(value), int(value.dtype or 0)))
    return infos


def is_concrete_value(value: ir.Value) -> bool:
    """Whether an IR value is a tensor of a known element type with every dimension fixed."""
    return (isinstance(value.type, ir.TensorType) and value.dtype not in (None, ir.DataType.UNDEFINED)
            and value.shape is not None and value.shape.is_static())


def _dims(value: ir.Value) -> tuple[int, ...]:
    """A concrete value's dimensions."""
    return () if value.shape is None else value.shape.numpy()
