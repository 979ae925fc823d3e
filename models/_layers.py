"""A tiny ONNX graph builder with seeded random weights and the layers the model builders share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 10
Dim = int | str


def batch_dim(batch: int | None) -> Dim:
    """The graph's batch dimension: a fixed size, or the symbolic `batch` when None."""
    return "batch" if batch is None else batch


class GraphBuilder:
    """Collects nodes and initializers; every node's single output tensor is named after the node."""

    def __init__(self, name: str, seed: int = 0) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._names: set[str] = {"input"}

    def _claim(self, name: str) -> str:
        """Reserve a graph-wide unique name (node, tensor or initializer)."""
        if name in self._names:
            raise ValueError(f"duplicate name {name!r} in {self.name}")
        self._names.add(name)
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        """Add an initializer holding `value`."""
        self.initializers.append(numpy_helper.from_array(value, self._claim(name)))
        return name

    def weight(self, name: str, shape: Sequence[int], fan_in: int, gain: float = 2.0) -> str:
        """Add a normal initializer with variance gain / fan_in (He init for gain 2)."""
        std = (gain / fan_in) ** 0.5
        return self.const(name, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def small(self, name: str, shape: Sequence[int], scale: float = 0.1, center: float = 0.0) -> str:
        """Add a float32 initializer uniform in center +- scale (biases, norm parameters, statistics)."""
        return self.const(name, (center + self.rng.uniform(-scale, scale, shape)).astype(np.float32))

    def op(self, op_type: str, inputs: Sequence[str], name: str, **attrs: Any) -> str:
        """Add a node with one output tensor named like the node; return that tensor's name."""
        self.nodes.append(helper.make_node(op_type, list(inputs), [self._claim(name)], name=name, **attrs))
        return name

    def model(self, input_shape: Sequence[Dim], output: str, output_shape: Sequence[Dim]) -> onnx.ModelProto:
        """Finish the graph: rename `output` to the graph output `output` and wrap it in a model."""
        for node in self.nodes:
            node.output[:] = ["output" if t == output else t for t in node.output]
            node.input[:] = ["output" if t == output else t for t in node.input]
        graph = helper.make_graph(
            self.nodes,
            self.name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(input_shape))],
            [helper.make_tensor_value_info("output", TensorProto.FLOAT, list(output_shape))],
            self.initializers,
        )
        return helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION, producer_name="onnx-remat"
        )

    # Layers shared by the builders.

    def conv(
        self, x: str, name: str, cin: int, cout: int, kernel: int, stride: int = 1, group: int = 1, bias: bool = False
    ) -> str:
        """A square 'same'-padded convolution (He init); bias only when asked."""
        fan_in = cin // group * kernel * kernel
        inputs = [x, self.weight(f"{name}.weight", (cout, cin // group, kernel, kernel), fan_in)]
        if bias:
            inputs.append(self.small(f"{name}.bias", (cout,)))
        pad = kernel // 2
        return self.op(
            "Conv", inputs, name, kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4, group=group
        )

    def batchnorm(self, x: str, name: str, channels: int, gamma: float = 1.0) -> str:
        """Inference-form BatchNormalization (one output) with random affine parameters and statistics."""
        inputs = [
            x,
            self.small(f"{name}.scale", (channels,), center=gamma, scale=0.1 * gamma),
            self.small(f"{name}.bias", (channels,)),
            self.small(f"{name}.mean", (channels,)),
            self.small(f"{name}.var", (channels,), center=1.0, scale=0.25),
        ]
        return self.op("BatchNormalization", inputs, name, epsilon=1e-5)

    def relu6(self, x: str, name: str) -> str:
        """ReLU6 as Clip(x, 0, 6) with shared bound initializers."""
        if "relu6.min" not in self._names:
            self.const("relu6.min", np.array(0.0, np.float32))
            self.const("relu6.max", np.array(6.0, np.float32))
        return self.op("Clip", [x, "relu6.min", "relu6.max"], name)

    def conv_bn(
        self,
        x: str,
        name: str,
        cin: int,
        cout: int,
        kernel: int,
        stride: int = 1,
        group: int = 1,
        act: str | None = "relu",
        gamma: float = 1.0,
        bn_name: str | None = None,
    ) -> str:
        """Conv, BatchNormalization and an optional activation ('relu' or 'relu6')."""
        y = self.conv(x, name, cin, cout, kernel, stride, group)
        y = self.batchnorm(y, bn_name or f"{name}.bn", cout, gamma)
        if act == "relu":
            return self.op("Relu", [y], f"{name}.relu")
        if act == "relu6":
            return self.relu6(y, f"{name}.relu6")
        return y

    def maxpool(self, x: str, name: str, kernel: int = 2, stride: int = 2, pad: int = 0) -> str:
        """Square max pooling."""
        return self.op("MaxPool", [x], name, kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4)

    def gemm(self, x: str, name: str, fin: int, fout: int, gain: float = 2.0) -> str:
        """A fully connected layer on a 2-D tensor: Gemm with transposed weight, like torch.nn.Linear."""
        w = self.weight(f"{name}.weight", (fout, fin), fin, gain)
        return self.op("Gemm", [x, w, self.small(f"{name}.bias", (fout,))], name, transB=1)

    def linear(self, x: str, name: str, fin: int, fout: int, gain: float = 1.0) -> str:
        """A fully connected layer on the last axis of an N-D tensor: MatMul then Add."""
        y = self.op("MatMul", [x, self.weight(f"{name}.weight", (fin, fout), fin, gain)], f"{name}.matmul")
        return self.op("Add", [y, self.small(f"{name}.bias", (fout,))], name)

    def classifier_head(self, x: str, channels: int, num_classes: int) -> str:
        """Global average pool, flatten and a final Gemm `fc`."""
        y = self.op("GlobalAveragePool", [x], "avgpool")
        y = self.op("Flatten", [y], "flatten", axis=1)
        return self.gemm(y, "fc", channels, num_classes, gain=1.0)
