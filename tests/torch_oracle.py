"""An independent gradient oracle: run an ONNX forward graph with torch ops and differentiate with autograd.

It shares nothing with onnx_remat's autodiff rules: every op is a direct torch translation of the ONNX
operator, BatchNormalization uses batch statistics (as a training graph does), and the loss follows the
definitions of passes/autodiff/loss.py. Float tensors are computed in float64.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

DTYPE = torch.float64
FLOATS = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16})


@dataclass(frozen=True)
class Call:
    """One node's evaluated inputs (None for absent optional ones), attributes and output count."""

    ins: list[torch.Tensor | None]
    attrs: dict[str, Any]
    outputs: int

    @property
    def x(self) -> torch.Tensor:
        """The first input."""
        return self.ins[0]

    def at(self, name: str, default: Any = None) -> Any:
        """An attribute's value, or `default`."""
        return self.attrs.get(name, default)

    def has(self, k: int) -> bool:
        """Whether optional input k is given."""
        return len(self.ins) > k and self.ins[k] is not None

    def ints(self, k: int) -> list[int]:
        """Input k (an integer tensor) as a list of ints."""
        return [int(v) for v in self.ins[k].reshape(-1).tolist()]


def tensor(value: np.ndarray) -> torch.Tensor:
    """A torch tensor of `value`, floats in the oracle's float64."""
    t = torch.from_numpy(np.array(value))
    return t.to(DTYPE) if t.is_floating_point() else t


def _torch_dtype(onnx_type: int) -> torch.dtype:
    """The oracle's dtype for an ONNX element type (every float type computes in float64)."""
    if onnx_type in FLOATS:
        return DTYPE
    return torch.from_numpy(np.zeros(0, helper.tensor_dtype_to_np_dtype(onnx_type))).dtype


def _torch_pads(pads: Sequence[int]) -> list[int]:
    """ONNX pads [b1.., e1..] as torch's F.pad pairs, last axis first."""
    n = len(pads) // 2
    return [p for axis in reversed(range(n)) for p in (pads[axis], pads[axis + n])]


def _spatial(c: Call, name: str, default: int) -> list[int]:
    """A per-spatial-axis attribute (strides, dilations) with its default."""
    return list(c.at(name, [default] * (c.x.dim() - 2)))


def _no_auto_pad(c: Call) -> None:
    if c.at("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise NotImplementedError("auto_pad is not supported by the oracle")


def conv(c: Call) -> torch.Tensor:
    """Conv, padding applied explicitly so asymmetric pads work."""
    _no_auto_pad(c)
    n = c.x.dim() - 2
    x = F.pad(c.x, _torch_pads(c.at("pads", [0] * 2 * n)))
    bias = c.ins[2] if c.has(2) else None
    return torch.convolution(x, c.ins[1], bias, _spatial(c, "strides", 1), [0] * n, _spatial(c, "dilations", 1),
                             False, [0] * n, c.at("group", 1))


def conv_transpose(c: Call) -> torch.Tensor:
    """ConvTranspose without padding, then cropped by the pads."""
    _no_auto_pad(c)
    n = c.x.dim() - 2
    bias = c.ins[2] if c.has(2) else None
    y = torch.convolution(c.x, c.ins[1], bias, _spatial(c, "strides", 1), [0] * n, _spatial(c, "dilations", 1),
                          True, _spatial(c, "output_padding", 0), c.at("group", 1))
    pads = c.at("pads", [0] * 2 * n)
    crop = [slice(pads[a], y.shape[a + 2] - pads[a + n]) for a in range(n)]
    return y[(slice(None), slice(None), *crop)]


def max_pool(c: Call) -> torch.Tensor:
    """MaxPool: pad with -inf, then torch's pooling."""
    _no_auto_pad(c)
    kernel = c.at("kernel_shape")
    x = F.pad(c.x, _torch_pads(c.at("pads", [0] * 2 * len(kernel))), value=-torch.inf)
    pool = getattr(F, f"max_pool{len(kernel)}d")
    return pool(x, kernel, c.at("strides", [1] * len(kernel)), 0, c.at("dilations", [1] * len(kernel)),
                bool(c.at("ceil_mode", 0)))


def average_pool(c: Call) -> torch.Tensor:
    """AveragePool with symmetric pads."""
    _no_auto_pad(c)
    kernel = c.at("kernel_shape")
    pads = c.at("pads", [0] * 2 * len(kernel))
    if pads[: len(kernel)] != pads[len(kernel) :]:
        raise NotImplementedError("asymmetric AveragePool pads are not supported by the oracle")
    pool = getattr(F, f"avg_pool{len(kernel)}d")
    return pool(c.x, kernel, c.at("strides", [1] * len(kernel)), pads[: len(kernel)], bool(c.at("ceil_mode", 0)),
                bool(c.at("count_include_pad", 0)))


def gemm(c: Call) -> torch.Tensor:
    """alpha * A' @ B' + beta * C."""
    a = c.x.T if c.at("transA", 0) else c.x
    b = c.ins[1].T if c.at("transB", 0) else c.ins[1]
    y = c.at("alpha", 1.0) * (a @ b)
    return y + c.at("beta", 1.0) * c.ins[2] if c.has(2) else y


def batch_norm(c: Call) -> torch.Tensor:
    """Training-mode BatchNormalization: normalize with the batch's mean and biased variance."""
    if c.outputs > 1:
        raise NotImplementedError("the oracle runs forward graphs: BatchNormalization with one output only")
    return F.batch_norm(c.x, None, None, c.ins[1], c.ins[2], training=True, eps=c.at("epsilon", 1e-5))


def layer_norm(c: Call) -> torch.Tensor:
    """LayerNormalization over the axes from `axis` on."""
    axis = c.at("axis", -1) % c.x.dim()
    bias = c.ins[2] if c.has(2) else None
    return F.layer_norm(c.x, c.x.shape[axis:], c.ins[1], bias, c.at("epsilon", 1e-5))


def _axes(c: Call) -> list[int] | None:
    """Reduction/squeeze axes from the attribute or the second input (None: not given)."""
    axes = c.at("axes")
    if axes is None and c.has(1):
        axes = c.ints(1)
    return None if axes is None else [a % c.x.dim() for a in axes]


def _reduce(fn: Callable[..., torch.Tensor]) -> Callable[[Call], torch.Tensor]:
    """ReduceMean/ReduceSum: axes from attribute or input, empty meaning all (or none with noop)."""

    def reduce(c: Call) -> torch.Tensor:
        axes = _axes(c)
        if not axes:
            if c.at("noop_with_empty_axes", 0):
                return c.x
            axes = list(range(c.x.dim()))
        return fn(c.x, dim=axes, keepdim=bool(c.at("keepdims", 1)))
    return reduce


def reshape(c: Call) -> torch.Tensor:
    """Reshape: 0 copies the input's dimension (unless allowzero), -1 is inferred."""
    shape = c.ints(1)
    if not c.at("allowzero", 0):
        shape = [c.x.shape[k] if d == 0 else d for k, d in enumerate(shape)]
    return c.x.reshape(shape)


def flatten(c: Call) -> torch.Tensor:
    """Flatten to 2-D at `axis`."""
    axis = c.at("axis", 1) % (c.x.dim() + 1)
    return c.x.reshape(int(np.prod(c.x.shape[:axis])), -1)


def split(c: Call) -> tuple[torch.Tensor, ...]:
    """Split by the `split` sizes (input or attribute) or into equal parts."""
    axis = c.at("axis", 0)
    sizes = c.ints(1) if c.has(1) else c.at("split")
    if sizes is None:
        sizes = -(-c.x.shape[axis] // c.outputs)
    return torch.split(c.x, sizes, dim=axis)


def slice_(c: Call) -> torch.Tensor:
    """Slice by starts/ends/axes/steps, ONNX clamping through Python's slice.indices."""
    starts, ends = c.ints(1), c.ints(2)
    axes = c.ints(3) if c.has(3) else list(range(len(starts)))
    steps = c.ints(4) if c.has(4) else [1] * len(starts)
    y = c.x
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        index = range(*slice(start, end, step).indices(y.shape[axis]))
        y = y.index_select(axis % y.dim(), torch.tensor(list(index), dtype=torch.long))
    return y


def squeeze(c: Call) -> torch.Tensor:
    """Squeeze the given axes, or every axis of size 1."""
    axes = _axes(c)
    if axes is None:
        axes = [a for a, d in enumerate(c.x.shape) if d == 1]
    return c.x.reshape([d for a, d in enumerate(c.x.shape) if a not in axes])


def unsqueeze(c: Call) -> torch.Tensor:
    """Insert axes of size 1 at the given output positions."""
    rank = c.x.dim() + len(c.ints(1))
    y = c.x
    for axis in sorted(a % rank for a in c.ints(1)):
        y = y.unsqueeze(axis)
    return y


def pad(c: Call) -> torch.Tensor:
    """Pad (constant, reflect or edge) every axis by the pads input."""
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}[_text(c.at("mode", "constant"))]
    value = float(c.ins[2]) if c.has(2) and mode == "constant" else None
    return F.pad(c.x, _torch_pads(c.ints(1)), mode=mode, value=value)


def gather(c: Call) -> torch.Tensor:
    """Gather along `axis`, negative indices counting from the end."""
    axis = c.at("axis", 0) % c.x.dim()
    index = c.ins[1].long()
    index = torch.where(index < 0, index + c.x.shape[axis], index)
    picked = c.x.index_select(axis, index.reshape(-1))
    return picked.reshape(*c.x.shape[:axis], *index.shape, *c.x.shape[axis + 1 :])


def divide(c: Call) -> torch.Tensor:
    """Div: true division for floats, truncation for integers."""
    a, b = c.ins
    return a / b if a.is_floating_point() else torch.div(a, b, rounding_mode="trunc")


def clip(c: Call) -> torch.Tensor:
    """Clip with optional min and max inputs (bounds are constants, not differentiated)."""
    low = c.ins[1].detach() if c.has(1) else None
    high = c.ins[2].detach() if c.has(2) else None
    return torch.clamp(c.x, low, high)


def shape(c: Call) -> torch.Tensor:
    """Shape, sliced by start/end."""
    dims = list(c.x.shape)[c.at("start", 0) : c.at("end", None)]
    return torch.tensor(dims, dtype=torch.int64)


def constant(c: Call) -> torch.Tensor:
    """Constant from whichever value attribute is set."""
    (key, value), = c.attrs.items()
    if key == "value":
        return tensor(numpy_helper.to_array(value))
    if key in ("value_float", "value_floats"):
        return torch.tensor(value, dtype=DTYPE)
    if key in ("value_int", "value_ints"):
        return torch.tensor(value, dtype=torch.int64)
    raise NotImplementedError(f"Constant with {key} is not supported by the oracle")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


OPS: dict[str, Callable[[Call], torch.Tensor | tuple[torch.Tensor, ...]]] = {
    "Conv": conv,
    "ConvTranspose": conv_transpose,
    "Gemm": gemm,
    "MatMul": lambda c: torch.matmul(*c.ins),
    "Add": lambda c: c.ins[0] + c.ins[1],
    "Sub": lambda c: c.ins[0] - c.ins[1],
    "Mul": lambda c: c.ins[0] * c.ins[1],
    "Div": divide,
    "Pow": lambda c: torch.pow(*c.ins),
    "Sqrt": lambda c: torch.sqrt(c.x),
    "Erf": lambda c: torch.erf(c.x),
    "Relu": lambda c: torch.relu(c.x),
    "LeakyRelu": lambda c: F.leaky_relu(c.x, c.at("alpha", 0.01)),
    "Sigmoid": lambda c: torch.sigmoid(c.x),
    "Tanh": lambda c: torch.tanh(c.x),
    "Clip": clip,
    "Softmax": lambda c: torch.softmax(c.x, c.at("axis", -1)),
    "LogSoftmax": lambda c: torch.log_softmax(c.x, c.at("axis", -1)),
    "BatchNormalization": batch_norm,
    "InstanceNormalization": lambda c: F.instance_norm(c.x, weight=c.ins[1], bias=c.ins[2], eps=c.at("epsilon", 1e-5)),
    "LayerNormalization": layer_norm,
    "MaxPool": max_pool,
    "AveragePool": average_pool,
    "GlobalAveragePool": lambda c: c.x.mean(dim=tuple(range(2, c.x.dim())), keepdim=True),
    "ReduceMean": _reduce(torch.mean),
    "ReduceSum": _reduce(torch.sum),
    "Flatten": flatten,
    "Reshape": reshape,
    "Transpose": lambda c: c.x.permute(c.at("perm", list(reversed(range(c.x.dim()))))),
    "Concat": lambda c: torch.cat(c.ins, dim=c.at("axis")),
    "Split": split,
    "Slice": slice_,
    "Squeeze": squeeze,
    "Unsqueeze": unsqueeze,
    "Pad": pad,
    "Identity": lambda c: c.x,
    "Cast": lambda c: c.x.to(_torch_dtype(c.at("to"))),
    "Shape": shape,
    "Gather": gather,
    "Constant": constant,
}


def run_forward(model: onnx.ModelProto, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every tensor of the forward graph, computed from `values` (inputs and initializers) in node order."""
    env = dict(values)
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in OPS:
            raise NotImplementedError(f"the oracle has no {node.domain or 'ai.onnx'}::{node.op_type}")
        call = Call([env[i] if i else None for i in node.input],
                    {a.name: helper.get_attribute_value(a) for a in node.attribute}, len(node.output))
        result = OPS[node.op_type](call)
        outputs = result if isinstance(result, tuple) else (result,)
        env.update((name, value) for name, value in zip(node.output, outputs, strict=True) if name)
    return env


def loss_value(output: torch.Tensor, label: torch.Tensor | None, kind: str) -> torch.Tensor:
    """The scalar loss as loss.py defines it: mean squared error, mean cross-entropy, or the plain sum."""
    if kind == "sum":
        return output.sum()
    if kind == "mse":
        return ((output - label) ** 2).mean()
    if kind == "cross-entropy":
        return -torch.log_softmax(output, dim=1).gather(1, label.long()[:, None]).sum() / output.shape[0]
    raise ValueError(f"unknown loss {kind!r}")


def leaves(model: onnx.ModelProto, parameters: Sequence[str]) -> dict[str, torch.Tensor]:
    """Every initializer as a torch tensor; the named parameters require gradients."""
    return {i.name: tensor(numpy_helper.to_array(i)).requires_grad_(i.name in parameters)
            for i in model.graph.initializer}


def reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray], loss: str,
              parameters: Sequence[str]) -> dict[str, np.ndarray]:
    """`loss` and `grad.<param>` for every parameter of the forward `model`, by torch autograd in float64."""
    params = leaves(model, parameters)
    inputs = {name: tensor(value) for name, value in feeds.items()}
    env = run_forward(model, {**params, **inputs})
    value = loss_value(env[model.graph.output[0].name], inputs.get("label"), loss)
    grads = torch.autograd.grad(value, [params[p] for p in parameters], allow_unused=True)
    result = {"loss": value.detach().numpy()}
    for name, grad in zip(parameters, grads, strict=True):
        result[f"grad.{name}"] = (torch.zeros_like(params[name]) if grad is None else grad).detach().numpy()
    return result
