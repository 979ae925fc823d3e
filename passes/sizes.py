"""Shape, element type and byte size of every tensor of a model whose shapes are resolved, and the bytes it takes
when onnxruntime's CPU allocator holds it (`core.allocation`, free of ONNX for the simulation)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from onnx_remat.core.allocation import ALIGNED_BLOCK_OVERHEAD as ALIGNED_BLOCK_OVERHEAD
from onnx_remat.core.allocation import DATA_OFFSET as DATA_OFFSET
from onnx_remat.core.allocation import HEAP_TENSOR_BYTES as HEAP_TENSOR_BYTES
from onnx_remat.core.allocation import MMAP_THRESHOLD as MMAP_THRESHOLD
from onnx_remat.core.allocation import PAGE_BYTES as PAGE_BYTES
from onnx_remat.core.allocation import allocated_bytes
from onnx_remat.core.allocation import on_heap as on_heap


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

    @property
    def allocated_bytes(self) -> int:
        """Bytes the tensor takes in onnxruntime's CPU allocator: a block glibc maps on its own takes whole pages,
        its header in the first (16 KiB of data take 20 KiB); a smaller one its data and HEAP_TENSOR_BYTES, in heap
        pages it shares."""
        return allocated_bytes(self.nbytes)


def held_as_initializer(node: ir.Node | onnx.NodeProto) -> bool:
    """Whether runtimes hold `node`'s output as an initializer: an ONNX Constant, which onnxruntime (and OpenVINO)
    turn into one as the session loads, resident from then on and never allocated by a run (measured: an 8 MiB
    Constant read by an Add raised the run's peak by the Add's output alone, as the same value as an initializer)."""
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx")


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
