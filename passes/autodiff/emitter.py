"""Create the backward nodes of one forward node in onnx-ir: readable names, constants, and shared tensor helpers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from onnx_remat.passes.autodiff.graph_info import GraphInfo

Shape = Sequence[int]


def node_attributes(attrs: Mapping[str, Any]) -> list[ir.Attr]:
    """`attrs` (Python values) as a node's attributes: tensors and lists of ints typed here, the rest by onnx-ir's
    convert_attribute, which tries its protocols' isinstance checks first on a tensor or a list (slow ones: 0.4 s of
    DenseNet-121's training step, whose backward has 3600 Constant nodes)."""
    return [ir.AttrTensor(name, value) if isinstance(value, ir.Tensor)
            else ir.AttrInt64s(name, value) if _int_list(value)
            else ir.convenience.convert_attribute(name, value) for name, value in attrs.items()]


def _int_list(value: Any) -> bool:
    """Whether `value` is a non-empty list or tuple of Python ints."""
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(item, int) for item in value)


class Names:
    """Hands out graph-wide unique names, counting per prefix."""

    def __init__(self, taken: set[str]) -> None:
        self._taken = taken
        self._count: dict[str, int] = {}

    def fresh(self, prefix: str) -> str:
        """`<prefix>/<k>` for the next free k."""
        while True:
            k = self._count.get(prefix, 0)
            self._count[prefix] = k + 1
            name = f"{prefix}/{k}"
            if name not in self._taken:
                return self.claim(name)

    def claim(self, name: str) -> str:
        """Reserve an exact name."""
        self._taken.add(name)
        return name


class Emitter:
    """Appends nodes named `<owner>.grad/<k>` to `sink` (outputs named like the node), computing in `dtype`."""

    def __init__(self, info: GraphInfo, names: Names, owner: str, sink: list[ir.Node], dtype: np.dtype) -> None:
        self.info = info
        self.dtype = dtype
        self.names = names
        self.owner = owner
        self.sink = sink
        self.prefix = f"{owner}.grad"

    def ops(self, op_type: str, inputs: Sequence[ir.Value | None], n_out: int, **attrs: Any) -> list[ir.Value]:
        """Add one node with `n_out` outputs named after the node; return its outputs."""
        name = self.names.fresh(self.prefix)
        node = ir.Node("", op_type, inputs, node_attributes(attrs), num_outputs=n_out, name=name)
        for j, output in enumerate(node.outputs):
            output.name = name if n_out == 1 else f"{name}:{j}"
        self.sink.append(node)
        return list(node.outputs)

    def op(self, op_type: str, *inputs: ir.Value | None, **attrs: Any) -> ir.Value:
        """Add one single-output node; return its output."""
        return self.ops(op_type, inputs, 1, **attrs)[0]

    # Constants.

    def const(self, value: np.ndarray) -> ir.Value:
        """A Constant node holding `value`."""
        return self.op("Constant", value=ir.tensor(np.asarray(value)))

    def ints(self, values: Sequence[int]) -> ir.Value:
        """A 1-D int64 constant."""
        return self.const(np.asarray(values, dtype=np.int64))

    def scalar(self, value: float) -> ir.Value:
        """A scalar constant in the float type being differentiated."""
        return self.const(np.asarray(value, dtype=self.dtype))

    def const_like(self, tensor: ir.Value, value: int | float) -> ir.Value:
        """A scalar constant of `tensor`'s element type (an index type, say)."""
        return self.const(np.asarray(value, dtype=self.info.np_dtype(tensor)))

    def zeros(self, shape: Shape) -> ir.Value:
        """A zero tensor (ConstantOfShape) in the float type being differentiated."""
        return self.op("ConstantOfShape", self.ints(shape), value=ir.tensor(np.zeros(1, dtype=self.dtype)))

    # Tensor helpers used by many rules.

    def reshape(self, x: ir.Value, shape: Shape) -> ir.Value:
        """Reshape to a static shape."""
        return self.op("Reshape", x, self.ints(shape))

    def transpose(self, x: ir.Value, perm: Sequence[int]) -> ir.Value:
        """Transpose, skipped for the identity permutation."""
        return x if list(perm) == sorted(perm) else self.op("Transpose", x, perm=list(perm))

    def reduce(self, op_type: str, x: ir.Value, axes: Sequence[int], keepdims: bool) -> ir.Value:
        """A Reduce* op over `axes`, in the form of the graph's opset: axes an input for ReduceSum from 13 and for
        the others from 18, an attribute before."""
        since = 13 if op_type == "ReduceSum" else 18
        if self.info.opset >= since:
            return self.op(op_type, x, self.ints(axes), keepdims=int(keepdims))
        return self.op(op_type, x, axes=list(axes), keepdims=int(keepdims))

    def reduce_sum(self, x: ir.Value, axes: Sequence[int], keepdims: bool) -> ir.Value:
        """ReduceSum over `axes`."""
        return self.reduce("ReduceSum", x, axes, keepdims)

    def reduce_mean(self, x: ir.Value, axes: Sequence[int]) -> ir.Value:
        """ReduceMean over `axes`, keeping them."""
        return self.reduce("ReduceMean", x, axes, keepdims=True)

    def scale(self, x: ir.Value, factor: float) -> ir.Value:
        """x * factor, skipped for factor 1."""
        return x if factor == 1 else self.op("Mul", x, self.scalar(factor))

    def sum_to(self, g: ir.Value, g_shape: Shape, shape: Shape) -> ir.Value:
        """Undo numpy broadcasting: sum `g` (of g_shape) over broadcast axes, then reshape to `shape`."""
        g_shape, shape = tuple(g_shape), tuple(shape)
        if g_shape == shape:
            return g
        lead = len(g_shape) - len(shape)
        axes = [a for a in range(len(g_shape)) if a < lead or (shape[a - lead] == 1 and g_shape[a] != 1)]
        if axes:
            g = self.reduce_sum(g, axes, keepdims=True)
        reduced = tuple(1 if a in axes else d for a, d in enumerate(g_shape))
        return g if reduced == shape else self.reshape(g, shape)
