"""Analytic operator cost: FLOPs and bytes moved, turned into seconds by a roofline."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import onnx_ir as ir

from onnx_remat.passes.manager import name_of
from onnx_remat.passes.sizes import TensorInfo

# Elementwise work per output element for ops that do more than one arithmetic step.
_FLOPS_PER_ELEMENT = {
    "Sigmoid": 4, "Tanh": 4, "Erf": 8, "Gelu": 10, "Softmax": 5, "LogSoftmax": 5,
    "BatchNormalization": 4, "InstanceNormalization": 8, "LayerNormalization": 8,
    "LeakyRelu": 2, "Clip": 2, "Div": 2, "Pow": 8, "Exp": 4, "Log": 4, "Sqrt": 2,
}


@dataclass(frozen=True)
class Roofline:
    """A device's analytic speed: sustained FLOP/s and memory bandwidth in bytes/s."""

    flops_per_second: float = 40e9
    bytes_per_second: float = 8e9
    overhead_seconds: float = 5e-6

    def seconds(self, flops: float, bytes_moved: float) -> float:
        """Time of an op bounded by compute or memory traffic, plus a fixed launch overhead."""
        return self.overhead_seconds + max(flops / self.flops_per_second, bytes_moved / self.bytes_per_second)


def node_flops(node: ir.Node, infos: dict[str, TensorInfo]) -> float:
    """Floating-point operations of one node (multiply-add counted as two)."""
    out = infos.get(name_of(node.outputs[0])) if node.outputs else None
    if out is None:
        return 0.0
    if node.op_type in ("Conv", "ConvTranspose"):
        # Conv weight is [Cout, Cin/g, k...] and each output element reads Cin/g * k inputs;
        # ConvTranspose weight is [Cin, Cout/g, k...] and each input element feeds Cout/g * k outputs.
        weight = infos[name_of(node.inputs[1])].shape
        fan = math.prod(weight[1:])
        elements = out.numel if node.op_type == "Conv" else infos[name_of(node.inputs[0])].numel
        return 2.0 * elements * fan
    if node.op_type in ("MatMul", "Gemm"):
        a = infos[name_of(node.inputs[0])].shape
        transposed = node.op_type == "Gemm" and bool(node.attributes.get_int("transA", 0))
        k = a[-2] if transposed else a[-1]
        return 2.0 * out.numel * k
    if node.op_type in ("MaxPool", "AveragePool"):
        kernel = node.attributes.get_ints("kernel_shape", [1])
        return float(out.numel * math.prod(kernel))
    if node.op_type.startswith("Global") or node.op_type.startswith("Reduce"):
        return float(sum(infos[name].numel for name in map(name_of, node.inputs[:1]) if name in infos))
    return float(out.numel * _FLOPS_PER_ELEMENT.get(node.op_type, 1))


def node_bytes_moved(node: ir.Node, infos: dict[str, TensorInfo]) -> int:
    """Bytes read and written by one node: its inputs and outputs once each; a Slice reads of its data only the
    part it writes (a Concat's gradient is one Slice of dy per input: reading all of dy each time overcounted
    DenseNet-121's training step by 12%)."""
    reads = [*node.inputs[1:], *node.outputs] if node.op_type == "Slice" else list(node.inputs)
    return _bytes_of(reads, infos) + _bytes_of(node.outputs, infos)


def _bytes_of(values: Sequence[ir.Value | None], infos: dict[str, TensorInfo]) -> int:
    """The bytes of those of `values` whose size is known."""
    names = [name_of(value) for value in values]
    return sum(infos[name].nbytes for name in names if name and name in infos)


def node_seconds(node: ir.Node, infos: dict[str, TensorInfo], device: Roofline) -> float:
    """Predicted run time of one node on a device described by a roofline; none for a Constant, which the runtimes
    turn into an initializer when they load the model."""
    if node.op_type == "Constant":
        return 0.0
    return device.seconds(node_flops(node, infos), node_bytes_moved(node, infos))

