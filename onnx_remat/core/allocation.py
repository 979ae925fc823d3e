"""The bytes a block of onnxruntime's CPU allocator takes: plain arithmetic, free of ONNX, shared by the tensor sizes
(`passes.sizes`) and the simulation (a session's execution frame)."""

from __future__ import annotations

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
