"""Shape, element type and byte size of every tensor of a model whose shapes are resolved, and the bytes it takes
when onnxruntime's CPU allocator holds it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

PAGE_BYTES = 4096
MMAP_THRESHOLD = PAGE_BYTES
"""glibc maps a block this large or larger on its own (the measurement sets it: `measure.MEASURING_ENV`)."""
ALIGNED_BLOCK_OVERHEAD = 96
"""Bytes glibc asks for beyond a tensor's data: onnxruntime aligns it to 64 bytes, and an aligned block takes that
much slack and a minimum chunk (32) more; the data then starts 64 bytes into its first page."""
DATA_OFFSET = 64
HEAP_TENSOR_BYTES = 350
"""Heap bytes a tensor served from glibc's heap takes beyond its data while it lives: its aligned block's slack and
onnxruntime's Tensor and OrtValue objects. 3000 such tensors live at once in one session (`tools/kept_memory.py
--fan`) grew the heap by 342 bytes each beyond 64 bytes of data, 362 beyond 1 KiB (mallinfo2, one process)."""


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


def on_heap(nbytes: int) -> bool:
    """Whether onnxruntime's CPU block for `nbytes` of data comes from glibc's heap (else it is mapped on its own)."""
    return nbytes + ALIGNED_BLOCK_OVERHEAD < MMAP_THRESHOLD


def allocated_bytes(nbytes: int) -> int:
    """Resident bytes of an onnxruntime CPU tensor of `nbytes` (see TensorInfo.allocated_bytes); none if empty."""
    if nbytes == 0:
        return 0
    if on_heap(nbytes):
        return nbytes + HEAP_TENSOR_BYTES
    return -(-(nbytes + DATA_OFFSET) // PAGE_BYTES) * PAGE_BYTES


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
