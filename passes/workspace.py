"""Transient memory an operator holds while it runs, beyond its inputs and outputs."""

from __future__ import annotations

import math

import onnx

from onnx_remat.passes.sizes import TensorInfo


def workspace_bytes(node: onnx.NodeProto, infos: dict[str, TensorInfo]) -> int:
    """Scratch bytes of one node in onnxruntime's CPU kernels (0 for ops that need none)."""
    return 0
