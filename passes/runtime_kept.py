"""What a runtime keeps per node after the node's first run: resident for every later run of its session.

onnxruntime's CPU provider keeps SHARED_BUFFER_BYTES for each node that writes into its input's buffer (a view such
as Reshape or Identity, an activation run in place: aliasing.shared_buffers), from the node's first run on, and
nothing measurable for a node writing a buffer of its own. Measured by `tools/kept_memory.py` on chains of 2000 nodes
of one op type on 16 KiB tensors, median of 5 fresh processes: 217-244 bytes per node for Relu, Sigmoid, HardSigmoid,
Tanh, Softmax, LogSoftmax, Identity and Reshape, 0-57 (the RSS counters' page-granular noise) for 24 op types that
write a buffer of their own, Conv, MatMul, Add and Where among them; a Relu in place after an Exp kept 307 per Relu
(3 processes), one whose input is read again 53 (docs/measurements.md). Other runtimes and providers keep nothing
counted here: OpenVINO (measured the same way, 3 processes: 0 KiB kept by chains of 2000 Relu, Add or Reshape, 28-32
by Conv at 500 and 2000 alike) and a GPU provider (its per-node state would be in host memory, not the device's; not
measured).
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx_ir as ir

from onnx_remat.core.devices import Device
from onnx_remat.passes.aliasing import shared_buffers
from onnx_remat.passes.manager import name_of

SHARED_BUFFER_BYTES = 223
"""onnxruntime CPU: bytes kept per node writing into its input's buffer (the median over the eight op types)."""


def kept_per_shared_buffer(device: Device) -> int:
    """Bytes `device`'s runtime keeps for each node writing into its input's buffer, after its first run."""
    if device.runtime != "onnxruntime" or device.provider != "CPUExecutionProvider":
        return 0
    return SHARED_BUFFER_BYTES


def sharing_nodes(nodes: Iterable[ir.Node], graph_outputs: set[str]) -> set[ir.Node]:
    """The nodes, run in their order, that write into their input's buffer (aliasing.shared_buffers)."""
    nodes = list(nodes)
    owner = shared_buffers(nodes, graph_outputs)
    return {node for node in nodes if node.outputs and name_of(node.outputs[0]) in owner}
