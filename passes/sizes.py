"""Shape, element type and byte size of every tensor in a shape-inferred model."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
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


def tensor_infos(model: onnx.ModelProto) -> dict[str, TensorInfo]:
    """Every named tensor with a known concrete shape: inputs, initializers, intermediates, outputs."""
    graph = model.graph
    infos = {init.name: TensorInfo(tuple(init.dims), init.data_type) for init in graph.initializer}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor = value.type.tensor_type
        if value.type.HasField("tensor_type") and all(d.HasField("dim_value") for d in tensor.shape.dim):
            infos.setdefault(value.name, TensorInfo(tuple(d.dim_value for d in tensor.shape.dim), tensor.elem_type))
    return infos
