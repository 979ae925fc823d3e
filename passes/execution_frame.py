"""onnxruntime's execution frame: one OrtValue per value of the session's graph, allocated as a run starts and held
until it ends.

`IExecutionFrame::Init` (onnxruntime/core/framework/execution_frame.cc) resizes `all_values_` to the session's
OrtValue index count, every name of its graph (initializers, inputs, node outputs); an OrtValue is a shared pointer
and a type pointer, 24 bytes on 64-bit hosts. Seen with an allocation tracer on SegFormer's dynamo training step at
batch 32 (its rewrite at the minimum, 1222 values): a 29,328-byte block allocated before the run's first tensor and
live at its peak, the 40 KiB the run allocated above the predicted activations with a few vectors of the feeds and
fetches (docs/measurements.md). Other runtimes keep their own structures, not counted here.
"""

from __future__ import annotations

import onnx

from onnx_remat.core.devices import Device
from onnx_remat.passes.sizes import DATA_OFFSET, PAGE_BYTES, allocated_bytes

ORT_VALUE_BYTES = 24
"""sizeof(OrtValue) on a 64-bit host."""
ROUNDING_BYTES = DATA_OFFSET + PAGE_BYTES
"""At most what the frame's block takes beyond 24 bytes per value: its header and its last page."""


def bytes_per_value(device: Device) -> int:
    """The frame's bytes per value of a session run on `device` (0 for a runtime not onnxruntime)."""
    return ORT_VALUE_BYTES if device.runtime == "onnxruntime" else 0


def session_values(model: onnx.ModelProto) -> int:
    """The OrtValue indices of a session of `model`: its graph's distinct value names."""
    graph = model.graph
    names = {init.name for init in graph.initializer} | {value.name for value in graph.input}
    names |= {name for node in graph.node for name in (*node.input, *node.output) if name}
    return len(names | {value.name for value in graph.output})


def frame_bytes(model: onnx.ModelProto, per_value: int = ORT_VALUE_BYTES) -> int:
    """Bytes of the frame a run of `model` holds throughout (`per_value` bytes per value)."""
    return allocated_bytes(per_value * session_values(model))
