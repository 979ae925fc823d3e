"""Every gradient rule on a one-node model: finite differences (float64), torch autograd, onnxruntime and OpenVINO."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import openvino as ov
import pytest
import torch
import torch.nn.functional as F
from conftest import step_as_proto
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper, shape_inference
from onnx.reference import ReferenceEvaluator
from onnx.reference.ops import op_conv_transpose, op_erf

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff import RULES
from onnx_remat.passes.autodiff.rules.base import NO_GRADIENT
from onnx_remat.passes.execute import ort_session

FD_TOLERANCE = 1e-6
TORCH_TOLERANCE = 1e-4


def rand(*shape: int, seed: int = 0, low: float | None = None) -> np.ndarray:
    """Seeded float64 normal values (uniform in [low, low + 1] when low is given)."""
    rng = np.random.default_rng(seed + 7 * len(shape) + sum(shape))
    return rng.standard_normal(shape) if low is None else low + rng.random(shape)


def ints(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


@dataclass(frozen=True)
class Case:
    """One op with inputs (float arrays are trained, others constants) and the same op in torch."""

    op: str
    inputs: Sequence[np.ndarray | None]
    torch_fn: Callable[..., torch.Tensor | Sequence[torch.Tensor]]
    attrs: dict = field(default_factory=dict)
    n_out: int = 1
    finite_differences: bool = True  # False where onnx's reference runtime lacks the op's forward
    openvino: bool = True  # False where OpenVINO cannot load or miscomputes the op's forward
    opset: int = 17

    def __repr__(self) -> str:
        shapes = [None if a is None else list(a.shape) for a in self.inputs]
        return f"{self.op}{shapes}{self.attrs}" + (f"@{self.opset}" if self.opset != 17 else "")


class Erf(op_erf.Erf):
    """onnx's reference Erf computes in float32; finite differences need float64."""

    def _run(self, x):
        return (np.vectorize(math.erf, otypes=[x.dtype])(x),)


class ConvTranspose(op_conv_transpose.ConvTranspose):
    """onnx's reference ConvTranspose slices grouped weights wrongly: run it one group at a time."""

    def _run(self, X, W, B=None, group=None, **attrs):  # noqa: N803 (the reference's names)
        group = group or 1
        biases = [None] * group if B is None else np.split(B, group)
        parts = [super(ConvTranspose, self)._run(x, w, b, group=1, **attrs)[0]
                 for x, w, b in zip(np.split(X, group, 1), np.split(W, group, 0), biases, strict=True)]
        return (np.concatenate(parts, axis=1),)


def reference(model: onnx.ModelProto) -> ReferenceEvaluator:
    """onnx's numpy reference runtime, in full float64 precision and with grouped ConvTranspose fixed."""
    return ReferenceEvaluator(model, new_ops=[Erf, ConvTranspose])


def is_float(array: np.ndarray | None) -> bool:
    return array is not None and array.dtype.kind == "f"


def case_model(case: Case, dtype: type) -> onnx.ModelProto:
    """The op on initializers, each output weighted by a fixed random probe and summed into `output`."""
    names = ["" if a is None else f"in{i}" for i, a in enumerate(case.inputs)]
    inits = [numpy_helper.from_array(a.astype(dtype) if is_float(a) else a, n)
             for n, a in zip(names, case.inputs, strict=True) if a is not None]
    outs = [f"out{j}" for j in range(case.n_out)]
    node = helper.make_node(case.op, names, outs, name="op", **case.attrs)
    graph = helper.make_graph([node], "case", [], [onnx.ValueInfoProto(name=o) for o in outs], inits)
    opset = [helper.make_opsetid("", case.opset)]
    alone = helper.make_model(graph, opset_imports=opset, ir_version=helper.find_min_ir_version_for(opset))
    nodes, partials = [node], []
    for j, (shape, elem) in enumerate(output_types(alone)):
        if elem.kind != "f":
            continue  # an index output (TopK's) carries no gradient
        inits.append(numpy_helper.from_array(rand(*shape, seed=100 + j).astype(elem), f"probe{j}"))
        nodes.append(helper.make_node("Mul", [outs[j], f"probe{j}"], [f"weighted{j}"], name=f"weigh{j}"))
        nodes.append(helper.make_node("ReduceSum", [f"weighted{j}"], [f"part{j}"], name=f"sum{j}", keepdims=0))
        partials.append(f"part{j}")
    nodes.append(helper.make_node("Sum", partials, ["output"], name="total"))
    out_type = helper.np_dtype_to_tensor_dtype(output_types(alone)[0][1])
    graph = helper.make_graph(nodes, "case", [], [helper.make_tensor_value_info("output", out_type, [])], inits)
    return helper.make_model(graph, opset_imports=opset, ir_version=helper.find_min_ir_version_for(opset))


def output_types(model: onnx.ModelProto) -> list[tuple[list[int], np.dtype]]:
    """Each output's shape and element type, by onnx's shape inference; by running the model in onnxruntime where
    inference leaves them unknown (it does not type GroupNormalization)."""
    inferred = shape_inference.infer_shapes(model, strict_mode=True).graph.output
    if all(value.type.tensor_type.elem_type for value in inferred):
        return [([d.dim_value for d in value.type.tensor_type.shape.dim],
                 helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)) for value in inferred]
    return [(list(array.shape), array.dtype) for array in run_ort(model).values()]


def probes(model: onnx.ModelProto) -> list[str]:
    return [i.name for i in model.graph.initializer if i.name.startswith("probe")]


def run_ort(model: onnx.ModelProto, feeds: dict | None = None) -> dict[str, np.ndarray]:
    """All outputs of a model run by onnxruntime on CPU."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds or {}), strict=True))


def run_openvino(model: onnx.ModelProto, feeds: dict | None = None) -> dict[str, np.ndarray]:
    """All outputs of a model run by OpenVINO on CPU in f32."""
    core = ov.Core()
    compiled = core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "f32"})
    results = compiled(feeds or {})
    return {out.get_any_name(): np.asarray(results[out]) for out in compiled.outputs}


def rel_err(actual: np.ndarray, expected: np.ndarray) -> float:
    """Largest absolute difference relative to the largest expected magnitude."""
    return float(np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-12))


def with_initializers(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy with some initializers replaced."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for init in copy.graph.initializer:
        if init.name in values:
            init.CopyFrom(numpy_helper.from_array(values[init.name], init.name))
    return copy


def check_finite_differences(case: Case) -> float:
    """Directional derivatives of the float64 loss vs the training graph's gradients (onnx reference runtime)."""
    model = case_model(case, np.float64)
    training = step_as_proto(model, loss="sum", freeze=probes(model))
    got = dict(zip([o.name for o in training.model.graph.output], reference(training.model).run(None, {}),
                   strict=True))
    params = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    worst = 0.0
    for k, (param, grad) in enumerate(zip(training.parameters, training.gradients, strict=True)):
        direction = rand(*params[param].shape, seed=1000 + k)
        step = 1e-6 * max(1.0, np.abs(params[param]).max())
        moved = [with_initializers(training.model, {param: params[param] + sign * step * direction})
                 for sign in (1, -1)]  # the training model: its forward is in training mode
        up, down = (float(reference(m).run(["loss"], {})[0]) for m in moved)
        numeric, analytic = (up - down) / (2 * step), float((got[grad] * direction).sum())
        bound = np.linalg.norm(got[grad]) * np.linalg.norm(direction) + 1e-12
        worst = max(worst, abs(numeric - analytic) / bound)
    assert worst < FD_TOLERANCE, f"{case}: finite differences disagree, rel err {worst:.2e}"
    return worst


def torch_grads(case: Case) -> dict[str, np.ndarray]:
    """Gradients of sum(probe_j * out_j) w.r.t. every float input, by torch autograd in float64."""
    model = case_model(case, np.float32)  # the probes the runtimes use (float64 models of function ops do not type)
    tensors = [None if a is None else torch.tensor(a, requires_grad=is_float(a)) for a in case.inputs]
    outs = case.torch_fn(*tensors)
    outs = [outs] if isinstance(outs, torch.Tensor) else list(outs)
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    total = sum((out * torch.tensor(values[f"probe{j}"], dtype=torch.float64)).sum() for j, out in enumerate(outs))
    total.backward()
    return {f"grad.in{i}": t.grad.numpy() for i, t in enumerate(tensors) if t is not None and t.grad is not None}


def check_runtimes(case: Case) -> float:
    """The float32 training graph in onnxruntime and OpenVINO vs torch autograd."""
    model = case_model(case, np.float32)
    training = step_as_proto(model, loss="sum", freeze=probes(model))
    onnx.checker.check_model(training.model, full_check=True)
    expected = torch_grads(case)
    assert set(training.gradients) == set(expected), f"{case}: gradients {training.gradients} vs {list(expected)}"
    worst = 0.0
    for runtime in (run_ort, run_openvino) if case.openvino else (run_ort,):
        got = runtime(training.model)
        for name, value in expected.items():
            worst = max(worst, rel_err(got[name], value))
    assert worst < TORCH_TOLERANCE, f"{case}: differs from torch by {worst:.2e}"
    return worst


def check(case: Case) -> None:
    if case.finite_differences:
        check_finite_differences(case)
    check_runtimes(case)


# Elementwise and broadcasting.
WITH_ZEROS = np.array([[-1.0, 0.0, 2.0], [0.0, 3.0, -0.5]])

ELEMENTWISE = [
    Case("Add", [rand(2, 3, 4), rand(3, 1)], lambda a, b: a + b),
    Case("Sub", [rand(2, 1, 4), rand(3, 4)], lambda a, b: a - b),
    Case("Sum", [rand(2, 3, 4), rand(3, 1), rand(4)], lambda a, b, c: a + b + c),
    Case("Mul", [rand(2, 3, 4), rand(4)], lambda a, b: a * b),
    Case("Div", [rand(2, 3), rand(2, 1, low=1.0)], lambda a, b: a / b),
    Case("Neg", [rand(3, 4)], lambda a: -a),
    Case("Relu", [rand(3, 4)], F.relu),
    Case("LeakyRelu", [rand(3, 4)], lambda a: F.leaky_relu(a, 0.2), {"alpha": 0.2}),
    Case("LeakyRelu", [rand(3, 4)], lambda a: F.leaky_relu(a, 1.5), {"alpha": 1.5}),  # y no longer has x's sign
    # At x = 0 (a kink, so no finite differences) torch's slope is 0 for Relu and alpha for LeakyRelu.
    Case("Relu", [WITH_ZEROS], F.relu, finite_differences=False),
    Case("LeakyRelu", [WITH_ZEROS], lambda a: F.leaky_relu(a, 0.2), {"alpha": 0.2}, finite_differences=False),
    Case("Sigmoid", [rand(3, 4)], torch.sigmoid),
    Case("Tanh", [rand(3, 4)], torch.tanh),
    # Bounds that are initializers are constants (ReLU6's); test_clip_by_computed_bounds trains computed ones.
    Case("Clip", [rand(3, 4), np.array(-0.5), np.array(0.7)], lambda a, lo, hi: a.clamp(lo.item(), hi.item())),
    Case("Clip", [rand(3, 4), None, np.array(0.3)], lambda a, lo, hi: a.clamp(max=hi.item())),
    Case("Erf", [rand(3, 4)], torch.erf),
    Case("Exp", [rand(3, 4)], torch.exp),
    Case("Log", [rand(3, 4, low=0.5)], torch.log),
    Case("Sqrt", [rand(3, 4, low=0.5)], torch.sqrt),
    Case("Reciprocal", [rand(3, 4, low=0.5)], torch.reciprocal),
    Case("Pow", [rand(3, 4, low=0.5), np.array(3.0)], lambda a, p: a ** p.item()),
    Case("Identity", [rand(3, 4)], lambda a: a),
    Case("Cast", [rand(3, 4)], lambda a: a, {"to": TensorProto.DOUBLE}),
    Case("CastLike", [rand(3, 4), np.zeros(1)], lambda a, like: a),
    Case("Where", [rand(3, 4) > 0, rand(3, 4), rand(4)], torch.where),
    Case("Expand", [rand(3, 1), ints(2, 3, 4)], lambda a, s: a.expand(2, 3, 4)),
    Case("Dropout", [rand(3, 4), np.array(0.0)], lambda a, r: a, openvino=False),  # OpenVINO: inference only
    # onnx's reference runs Gelu through its function body, whose Erf is float32: no finite differences.
    Case("Gelu", [rand(3, 4)], F.gelu, finite_differences=False, opset=20),
    Case("Gelu", [rand(3, 4)], lambda a: F.gelu(a, approximate="tanh"), {"approximate": "tanh"}, opset=20),
    Case("HardSigmoid", [rand(3, 4) * 3], lambda a: torch.clamp(0.3 * a + 0.4, 0, 1), {"alpha": 0.3, "beta": 0.4}),
    Case("HardSwish", [rand(4, 5) * 3], F.hardswish),
    Case("Softplus", [rand(3, 4)], F.softplus),
    Case("Mish", [rand(3, 4)], F.mish, opset=18),
    Case("Elu", [rand(3, 4)], lambda a: F.elu(a, 0.7), {"alpha": 0.7}),
    Case("PRelu", [rand(2, 3, 4, 5), rand(3, 1, 1)], lambda x, s: F.prelu(x, s.flatten())),
    Case("Abs", [rand(3, 4)], torch.abs),
    Case("Max", [rand(2, 3, 4), rand(3, 1)], torch.maximum),
    Case("Min", [rand(2, 3, 4), rand(4)], torch.minimum),
    # Ties share dy evenly, as torch.maximum (not differentiable there: no finite differences).
    Case("Max", [WITH_ZEROS, np.zeros((2, 3))], torch.maximum, finite_differences=False),
    Case("Sin", [rand(3, 4)], torch.sin),
    Case("Selu", [rand(3, 4)], F.selu),
    Case("Celu", [rand(3, 4)], lambda a: F.celu(a, 0.7), {"alpha": 0.7}, finite_differences=False),  # float32 only
    Case("Cos", [rand(3, 4)], torch.cos),
    Case("Tan", [rand(3, 4)], torch.tan),
    Case("Asin", [rand(3, 4, low=-0.5)], torch.asin),
    Case("Acos", [rand(3, 4, low=-0.5)], torch.acos),
    Case("Atan", [rand(3, 4) * 2], torch.atan),
    Case("Sinh", [rand(3, 4)], torch.sinh),
    Case("Cosh", [rand(3, 4)], torch.cosh),
    Case("Asinh", [rand(3, 4) * 2], torch.asinh),
    Case("Acosh", [rand(3, 4, low=1.5)], torch.acosh),
    Case("Atanh", [rand(3, 4, low=-0.5)], torch.atanh),
    Case("Mean", [rand(2, 3, 4), rand(3, 1), rand(4)], lambda a, b, c: (a + b + c) / 3),
    Case("Mod", [rand(3, 4) * 5, rand(4, low=0.7)], torch.fmod, {"fmod": 1}),
    Case("Mod", [rand(2, 3) * 5, -rand(2, 1, low=0.7)], torch.fmod, {"fmod": 1}),
    Case("Swish", [rand(3, 4) * 2], lambda x: x * torch.sigmoid(1.5 * x), {"alpha": 1.5}, opset=24),
    Case("Softsign", [rand(3, 4) * 2], F.softsign),
    Case("Shrink", [rand(3, 4) * 2], lambda x: F.softshrink(x, 0.7), {"lambd": 0.7, "bias": 0.7}),
    Case("Shrink", [rand(3, 4) * 2], lambda x: F.hardshrink(x, 0.5)),
    Case("ThresholdedRelu", [rand(3, 4) * 2], lambda x: F.threshold(x, 0.4, 0.0), {"alpha": 0.4}),
]


@pytest.mark.parametrize("case", ELEMENTWISE, ids=repr)
def test_elementwise(case: Case) -> None:
    check(case)


# Linear algebra.

SINGULAR = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.5], [0.5, -1.0, 2.0]]) @ np.diag([1.0, 1.0, 0.0])  # rank 2

DETS = [  # OpenVINO 2026.4 has no Det
    Case("Det", [rand(2, 3, 3)], torch.linalg.det, openvino=False),
    Case("Det", [rand(4, 4)], torch.linalg.det, opset=22, openvino=False),
    Case("Det", [rand(2, 1, 2, 2)], torch.linalg.det, openvino=False),
    Case("Det", [rand(3, 1, 1)], torch.linalg.det, openvino=False),
]


@pytest.mark.parametrize("case", DETS, ids=repr)
def test_det(case: Case) -> None:
    check(case)


def test_det_of_a_singular_matrix() -> None:
    """The cofactors, not an inverse: exact where A is singular (rank 2 of 3: torch gives zeros there, the finite
    differences -4 and 2)."""
    check_finite_differences(Case("Det", [SINGULAR], None))


def gemm_torch(alpha: float, beta: float, ta: int, tb: int) -> Callable[..., torch.Tensor]:
    def fn(a, b, c=None):
        out = alpha * (a.T if ta else a) @ (b.T if tb else b)
        return out if c is None else out + beta * c
    return fn


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ta=st.integers(0, 1), tb=st.integers(0, 1), c_shape=st.sampled_from([None, (3, 5), (5,), (1, 5), (3, 1)]),
       alpha=st.sampled_from([1.0, 0.5]), beta=st.sampled_from([1.0, 2.0]))
def test_gemm(ta: int, tb: int, c_shape: tuple[int, ...] | None, alpha: float, beta: float) -> None:
    a = rand(4, 3) if ta else rand(3, 4)
    b = rand(5, 4) if tb else rand(4, 5)
    inputs = [a, b] + ([] if c_shape is None else [rand(*c_shape, seed=3)])
    attrs = {"alpha": alpha, "beta": beta, "transA": ta, "transB": tb}
    check(Case("Gemm", inputs, gemm_torch(alpha, beta, ta, tb), attrs))


@pytest.mark.parametrize("shapes", [((2, 3, 4), (4, 5)), ((4,), (2, 4, 5)), ((3, 4), (4,)), ((4,), (4,)),
                                    ((2, 1, 3, 4), (5, 4, 2)), ((3, 4), (2, 4, 2))], ids=str)
def test_matmul(shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    check(Case("MatMul", [rand(*shapes[0]), rand(*shapes[1], seed=1)], torch.matmul))


def conv_torch(rank: int, stride, pads, dilation, group: int, transpose: bool = False, out_pad=None):
    """torch conv(-transpose) with ONNX-style (possibly asymmetric) pads."""
    conv = [F.conv1d, F.conv2d, F.conv3d][rank - 1]
    convt = [F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d][rank - 1]

    def fn(x, w, b=None):
        if transpose:
            full = convt(x, w, b, stride, 0, out_pad, group, dilation)
            index = [slice(None), slice(None)] + [slice(pads[i], full.shape[2 + i] - pads[rank + i])
                                                  for i in range(rank)]
            return full[tuple(index)]
        padded = F.pad(x, [p for i in reversed(range(rank)) for p in (pads[i], pads[rank + i])])
        return conv(padded, w, b, stride, 0, dilation, group)
    return fn


@st.composite
def conv_cases(draw: st.DrawFn) -> Case:
    rank = draw(st.sampled_from([1, 2, 2, 2]))
    group = draw(st.sampled_from([1, 1, 2, 4]))
    cin = group * draw(st.integers(1, 2))
    cout = group * draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 3)) for _ in range(rank)]
    stride = [draw(st.integers(1, 3)) for _ in range(rank)]
    dilation = [draw(st.integers(1, 2)) for _ in range(rank)]
    pads = [draw(st.integers(0, 2)) for _ in range(2 * rank)]
    size = [draw(st.integers((k - 1) * d + 1, 7)) for k, d in zip(kernel, dilation, strict=True)]
    bias = draw(st.booleans())
    inputs = [rand(2, cin, *size), rand(cout, cin // group, *kernel, seed=1)] + ([rand(cout, seed=2)] if bias else [])
    attrs = {"strides": stride, "dilations": dilation, "pads": pads, "group": group, "kernel_shape": kernel}
    return Case("Conv", inputs, conv_torch(rank, stride, pads, dilation, group), attrs)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=conv_cases())
def test_conv(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_conv_auto_pad(auto_pad: str) -> None:
    """auto_pad resolves to the pads onnx's reference runtime uses (no torch equivalent for SAME_LOWER)."""
    check_finite_differences(Case("Conv", [rand(1, 2, 7, 6), rand(3, 2, 3, 2, seed=1)], None,
                                  {"auto_pad": auto_pad, "strides": [2, 2]}))


def test_conv_depthwise() -> None:
    attrs = {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]}
    check(Case("Conv", [rand(2, 4, 6, 6), rand(4, 1, 3, 3, seed=1)], conv_torch(2, 2, [1] * 4, 1, 4), attrs))


SQUARE_WEIGHTS = [  # OpenVINO 2026.4 miscomputes a square weight shared by forward and backward ops
    Case("Conv", [rand(2, 4, 5, 5), rand(4, 4, 3, 3, seed=1)], conv_torch(2, 1, [1] * 4, 1, 1), {"pads": [1] * 4}),
    Case("ConvTranspose", [rand(2, 4, 3, 3), rand(4, 4, 3, 3, seed=1)], conv_torch(2, 2, [0] * 4, 1, 1, True, 0),
         {"strides": [2, 2]}),
    # grouped, square within each group (found by hypothesis: input gradients off by 72-130% in OpenVINO)
    Case("Conv", [rand(2, 4, 5, 5), rand(4, 2, 3, 3, seed=1)], conv_torch(2, 1, [0] * 4, 1, 2), {"group": 2}),
    Case("ConvTranspose", [rand(2, 4, 3, 4), rand(4, 2, 1, 1, seed=1)], conv_torch(2, 1, [0] * 4, 1, 2, True, 0),
         {"group": 2}),
    Case("MatMul", [rand(2, 3, 4), rand(4, 4, seed=1)], torch.matmul),
    Case("Gemm", [rand(3, 4), rand(4, 4, seed=1)], gemm_torch(0.5, 1.0, 0, 1), {"alpha": 0.5, "transB": 1}),
]


@pytest.mark.parametrize("case", SQUARE_WEIGHTS, ids=repr)
def test_square_weights(case: Case) -> None:
    check(case)


@st.composite
def conv_transpose_cases(draw: st.DrawFn) -> Case:
    group = draw(st.sampled_from([1, 1, 2]))
    cin, cout = group * draw(st.integers(1, 2)), group * draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 3)) for _ in range(2)]
    stride = [draw(st.integers(1, 3)) for _ in range(2)]
    dilation = [draw(st.integers(1, 2)) for _ in range(2)]
    out_pad = [draw(st.integers(0, s - 1)) for s in stride]  # onnx's reference runtime needs < stride
    pads = [draw(st.integers(0, (k - 1) * d // 2)) for k, d in zip(kernel * 2, dilation * 2, strict=True)]
    bias = draw(st.booleans())
    inputs = [rand(2, cin, 3, 4), rand(cin, cout // group, *kernel, seed=1)] + ([rand(cout, seed=2)] if bias else [])
    attrs = {"strides": stride, "dilations": dilation, "pads": pads, "group": group, "output_padding": out_pad}
    return Case("ConvTranspose", inputs, conv_torch(2, stride, pads, dilation, group, True, out_pad), attrs)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=conv_transpose_cases())
def test_conv_transpose(case: Case) -> None:
    check(case)


# Normalizations and softmaxes.

NORMS = [
    Case("BatchNormalization", [rand(4, 3, 5, 5), rand(3, low=0.5), rand(3), rand(3), rand(3, low=0.5)],
         lambda x, s, b, m, v: F.batch_norm(x, m.detach().clone(), v.detach().clone(), s, b, True, 0.1, 1e-5),
         {"epsilon": 1e-5}),
    Case("BatchNormalization", [rand(6, 3), rand(3, low=0.5), rand(3), rand(3), rand(3, low=0.5)],
         lambda x, s, b, m, v: F.batch_norm(x, m.detach().clone(), v.detach().clone(), s, b, True, 0.1, 1e-3),
         {"epsilon": 1e-3}),
    Case("InstanceNormalization", [rand(2, 3, 4, 5), rand(3, low=0.5), rand(3)],
         lambda x, s, b: F.instance_norm(x, weight=s, bias=b, eps=1e-5)),
    Case("LayerNormalization", [rand(2, 3, 8), rand(8, low=0.5), rand(8)],
         lambda x, s, b: F.layer_norm(x, (8,), s, b, 1e-5)),
    Case("LayerNormalization", [rand(2, 3, 4), rand(3, 4, low=0.5), rand(3, 4)],
         lambda x, s, b: F.layer_norm(x, (3, 4), s, b, 1e-5), {"axis": 1}),
    Case("LayerNormalization", [rand(2, 3, 4), rand(4, low=0.5)],
         lambda x, s: F.layer_norm(x, (4,), s, None, 1e-5)),
    Case("Softmax", [rand(2, 3, 4)], lambda x: F.softmax(x, 1), {"axis": 1}),
    Case("Softmax", [rand(2, 5)], lambda x: F.softmax(x, -1)),
    Case("LayerNormalization", [rand(2, 3, 8), rand(8, low=0.5), rand(8)],
         lambda x, s, b: F.layer_norm(x, (8,), s, b, 1e-5), opset=20),
    Case("BatchNormalization", [rand(4, 3, 5, 5), rand(3, low=0.5), rand(3), rand(3), rand(3, low=0.5)],
         lambda x, s, b, m, v: F.batch_norm(x, m.detach().clone(), v.detach().clone(), s, b, True, 0.1, 1e-5),
         {"epsilon": 1e-5}, opset=18),
    Case("LogSoftmax", [rand(2, 3, 4)], lambda x: F.log_softmax(x, -1)),
    # OpenVINO's LRN differs from onnxruntime's and torch's forward (by 0.49 on the case below).
    # onnx's function bodies of GroupNormalization and MeanVarianceNormalization do not type-check in float64, and
    # its reference LpNormalization (p=1 sums x, not |x|) and LRN (windows over the batch axis) are wrong: those
    # cases are checked against torch alone.
    Case("GroupNormalization", [rand(2, 6, 3, 4), rand(6, low=0.5), rand(6)],
         lambda x, s, b: F.group_norm(x, 3, s, b, 1e-5), {"num_groups": 3, "epsilon": 1e-5}, opset=21,
         finite_differences=False),
    Case("RMSNormalization", [rand(2, 3, 8), rand(8, low=0.5)], lambda x, s: F.rms_norm(x, (8,), s, 1e-5),
         opset=23),
    Case("RMSNormalization", [rand(2, 3, 4), rand(3, 4, low=0.5)], lambda x, s: F.rms_norm(x, (3, 4), s, 1e-3),
         {"axis": 1, "epsilon": 1e-3}, opset=23),
    Case("LpNormalization", [rand(2, 3, 4)], lambda x: F.normalize(x, 2.0, -1)),
    # OpenVINO reads opset 13's ReduceL1 (in the gradient) as reducing everything: the opset-18 form here.
    Case("LpNormalization", [rand(2, 3, 4)], lambda x: F.normalize(x, 1.0, 1), {"axis": 1, "p": 1},
         finite_differences=False, opset=18),
    Case("LpNormalization", [rand(2, 3, 4)], lambda x: F.normalize(x, 2.0, 0), {"axis": 0}, opset=22),
    Case("MeanVarianceNormalization", [rand(2, 3, 4, 5)],
         lambda x: (x - x.mean((0, 2, 3), True)) / x.var((0, 2, 3), unbiased=False, keepdim=True).sqrt(),
         {"axes": [0, 2, 3]}, finite_differences=False),
    Case("MeanVarianceNormalization", [rand(2, 3, 4)],
         lambda x: (x - x.mean(-1, True)) / x.var(-1, unbiased=False, keepdim=True).sqrt(), {"axes": [-1]},
         finite_differences=False),
    Case("LRN", [rand(2, 7, 3, 4)], lambda x: F.local_response_norm(x, 3, 0.1, 0.75, 1.5),
         {"size": 3, "alpha": 0.1, "beta": 0.75, "bias": 1.5}, finite_differences=False, openvino=False),
]

LABELS = np.array([0, 4, 2])
SPATIAL_LABELS = np.array([[0, 1, 3], [1, 1, 2]])  # (N, d) for scores (N, C=4, d)
LOSSES = [  # Class weights are constants (torch's weight= is no parameter), so detached in torch.
    Case("SoftmaxCrossEntropyLoss", [rand(3, 5), LABELS], lambda x, t: F.cross_entropy(x, t)),
    Case("SoftmaxCrossEntropyLoss", [rand(2, 4, 3), SPATIAL_LABELS, rand(4, low=0.5)],
         lambda x, t, w: F.cross_entropy(x, t, w.detach(), ignore_index=1), {"ignore_index": 1}),
    Case("SoftmaxCrossEntropyLoss", [rand(3, 5), LABELS],
         lambda x, t: (F.cross_entropy(x, t, reduction="sum"), F.log_softmax(x, 1)), {"reduction": "sum"}, n_out=2),
    Case("SoftmaxCrossEntropyLoss", [rand(4, 5), np.array([0, -100, 3, 2])],
         lambda x, t: F.cross_entropy(x, t, reduction="none"), {"reduction": "none", "ignore_index": -100}),
    Case("SoftmaxCrossEntropyLoss", [rand(3, 5), LABELS], lambda x, t: F.cross_entropy(x, t), opset=13),
    Case("NegativeLogLikelihoodLoss", [rand(3, 5), LABELS, rand(5, low=0.5)],
         lambda x, t, w: F.nll_loss(x, t, w.detach())),
    Case("NegativeLogLikelihoodLoss", [rand(2, 4, 3), SPATIAL_LABELS],
         lambda x, t: F.nll_loss(x, t, ignore_index=2, reduction="none"), {"reduction": "none", "ignore_index": 2}),
    Case("NegativeLogLikelihoodLoss", [rand(3, 5), LABELS], lambda x, t: F.nll_loss(x, t, reduction="sum"),
         {"reduction": "sum"}, opset=22),
]


@pytest.mark.parametrize("case", LOSSES, ids=repr)
def test_loss(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("case", NORMS, ids=repr)
def test_norm(case: Case) -> None:
    check(case)



def test_group_norm_per_group_scale_is_refused_naming_the_node() -> None:
    """Opset 18's per-group scale and bias (deprecated; the checker refuses the node) have no rule."""
    model = case_model(Case("GroupNormalization", [rand(2, 6, 5), rand(2, low=0.5), rand(2)], None,
                            {"num_groups": 2}, opset=18), np.float32)
    with pytest.raises(ModelError, match="GroupNormalization 'op'.*opset 21"):
        step_as_proto(model, loss="sum", freeze=probes(model))


# Pooling and reductions.

def torch_pads(pads: list[int]) -> list[int]:
    return pads[: len(pads) // 2]


POOLS = [
    Case("MaxPool", [rand(2, 3, 7, 7)], lambda x: F.max_pool2d(x, 3, 2, 1), {"kernel_shape": [3, 3],
                                                                             "strides": [2, 2], "pads": [1] * 4}),
    Case("MaxPool", [rand(2, 3, 6, 6)], lambda x: F.max_pool2d(x, 2, 2), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    Case("MaxPool", [rand(1, 2, 7, 8)], lambda x: F.max_pool2d(x, 2, 2, ceil_mode=True),
         {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    Case("MaxPool", [rand(1, 2, 9, 9)], lambda x: F.max_pool2d(x, 3, 1, dilation=2),
         {"kernel_shape": [3, 3], "dilations": [2, 2]}),
    Case("AveragePool", [rand(2, 3, 7, 7)], lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
         {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4}),
    Case("AveragePool", [rand(2, 3, 7, 7)], lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=True),
         {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4, "count_include_pad": 1}),
    Case("AveragePool", [rand(2, 3, 6, 6)], lambda x: F.avg_pool2d(x, 2, 2), {"kernel_shape": [2, 2],
                                                                             "strides": [2, 2]}),
    Case("AveragePool", [rand(1, 2, 5, 4)], lambda x: F.avg_pool1d(x.flatten(0, 1), 2, 3).view(1, 2, 5, 1),
         {"kernel_shape": [1, 2], "strides": [1, 3]}),
    Case("GlobalAveragePool", [rand(2, 3, 4, 5)], lambda x: x.mean((2, 3), keepdim=True)),
    Case("ReduceMean", [rand(2, 3, 4)], lambda x: x.mean(1), {"axes": [1], "keepdims": 0}),
    Case("ReduceMean", [rand(2, 3, 4)], lambda x: x.mean((0, 2), keepdim=True), {"axes": [0, -1]}),
    Case("ReduceSum", [rand(2, 3, 4), ints(0, 2)], lambda x, a: x.sum((0, 2), keepdim=True)),
    Case("ReduceSum", [rand(2, 3, 4), ints(1)], lambda x, a: x.sum(1), {"keepdims": 0}),
    Case("ReduceSum", [rand(2, 3, 4)], lambda x: x.sum(), {"keepdims": 0}),
    Case("ReduceMean", [rand(2, 3, 4), ints(0, -1)], lambda x, a: x.mean((0, 2), keepdim=True), opset=18),
    Case("ReduceMean", [rand(2, 3, 4), ints(1)], lambda x, a: x.mean(1), {"keepdims": 0}, opset=20),
    Case("ReduceMax", [rand(2, 3, 4)], lambda x: x.amax(1), {"axes": [1], "keepdims": 0}),
    Case("ReduceMax", [rand(2, 3, 4), ints(0, -1)], lambda x, a: x.amax((0, 2), keepdim=True), opset=18),
    # Ties share the gradient evenly, as torch.amax does (not differentiable there: no finite differences).
    Case("ReduceMax", [np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]])], lambda x: x.amax(1), {"axes": [1], "keepdims": 0},
         finite_differences=False),
    Case("ReduceMin", [rand(2, 3, 4)], lambda x: x.amin(1), {"axes": [1], "keepdims": 0}),
    Case("ReduceL2", [rand(2, 3, 4)], lambda x: x.norm(dim=-1), {"axes": [-1], "keepdims": 0}),
    Case("ReduceL2", [rand(2, 3, 4), ints(0, 2)], lambda x, a: x.norm(dim=(0, 2), keepdim=True), opset=18),
    # A zero norm has a zero gradient, as torch's (not differentiable there: no finite differences).
    Case("ReduceL2", [np.vstack([rand(1, 4), np.zeros((1, 4))])], lambda x: x.norm(dim=1), {"axes": [1], "keepdims": 0},
         finite_differences=False),
    Case("ReduceL1", [rand(2, 3, 4)], lambda x: x.abs().sum(1, keepdim=True), {"axes": [1]}),
    Case("ReduceSumSquare", [rand(2, 3, 4)], lambda x: x.square().sum((0, 2)), {"axes": [0, 2], "keepdims": 0}),
    # OpenVINO reads opset 13's ReduceLogSumExp (axes an attribute) as reducing everything: the opset-18 form here.
    Case("ReduceLogSumExp", [rand(2, 3, 4), ints(-1)], lambda x, a: x.logsumexp(-1), {"keepdims": 0}, opset=18),
    Case("ReduceLogSumExp", [rand(2, 3, 4), ints(1)], lambda x, a: x.logsumexp(1, keepdim=True), opset=18),
    Case("GlobalMaxPool", [rand(2, 3, 4, 5)], lambda x: F.adaptive_max_pool2d(x, 1)),
    Case("ReduceProd", [rand(2, 3, 4, low=0.5)], lambda x: x.prod(1), {"axes": [1], "keepdims": 0}),
    # Zeros: one in a row (its gradient is the others' product), two in a row (all zero), none.
    Case("ReduceProd", [np.array([[0.5, 0.0, 2.0], [0.0, 3.0, 0.0], [1.5, -2.0, 0.5]]), ints(1)],
         lambda x, a: x.prod(1, keepdim=True), opset=18, finite_differences=False),
    Case("ReduceProd", [rand(2, 3, 4, low=0.5), ints(0, 2)], lambda x, a: x.prod(2).prod(0), {"keepdims": 0},
         opset=18),
    # OpenVINO reads opset 13's ReduceLogSum as reducing everything, as ReduceLogSumExp: the opset-18 form here.
    Case("ReduceLogSum", [rand(2, 3, 4, low=0.5), ints(-1)], lambda x, a: x.sum(-1).log(), {"keepdims": 0},
         opset=18),
    Case("ReduceLogSum", [rand(2, 3, 4, low=0.5), ints(0, 1)], lambda x, a: x.sum((0, 1), keepdim=True).log(),
         opset=18),
    # OpenVINO 2026.4 has no CumProd.
    Case("CumProd", [rand(2, 5, 3), np.array(1)], lambda x, a: x.cumprod(1), opset=26, openvino=False),
    Case("CumProd", [np.array([[0.5, 0.0, 2.0, 0.0], [1.5, 3.0, 0.0, -1.0]]), np.array(-1)],
         lambda x, a: x.flip(1).cumprod(1).flip(1), {"reverse": 1}, opset=26, finite_differences=False,
         openvino=False),
    Case("CumProd", [rand(4, 3), np.array(0)],
         lambda x, a: torch.cat([torch.ones(1, 3, dtype=x.dtype), x[:-1].cumprod(0)]), {"exclusive": 1}, opset=26,
         openvino=False),
    Case("CumProd", [np.array([[0.5, 0.0, 2.0, 3.0]]), np.array(1)],
         lambda x, a: torch.cat([x[:, 1:].flip(1).cumprod(1).flip(1), torch.ones(1, 1, dtype=x.dtype)], 1),
         {"exclusive": 1, "reverse": 1}, opset=26, finite_differences=False, openvino=False),
    Case("LpPool", [rand(2, 3, 7, 7)], lambda x: F.lp_pool2d(x, 2, 3, 2), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    Case("LpPool", [rand(1, 2, 6, 5)], lambda x: F.lp_pool2d(x, 2, 2, 1),
         {"kernel_shape": [2, 2], "p": 2}, opset=18),
    # onnx's reference runtime has no GlobalLpPool.
    Case("GlobalLpPool", [rand(2, 3, 4, 5)], lambda x: x.square().sum((2, 3), keepdim=True).sqrt(),
         finite_differences=False),
    Case("GlobalLpPool", [rand(2, 3, 4, 5)], lambda x: x.abs().pow(3).sum((2, 3), keepdim=True).pow(1 / 3), {"p": 3},
         finite_differences=False),
    Case("LpPool", [rand(2, 3, 5, 5)], lambda x: F.avg_pool2d(x.abs().pow(3), 2, 1).mul(4).pow(1 / 3),
         {"kernel_shape": [2, 2], "p": 3}),
    Case("MaxUnpool", [rand(1, 2, 2, 2), np.array([[[[0, 3], [9, 14]], [[16, 22], [25, 31]]]])],
         lambda x, i: F.max_unpool2d(x, i - torch.arange(2).view(1, 2, 1, 1) * 16, 2, 2),
         {"kernel_shape": [2, 2], "strides": [2, 2]}, openvino=False),  # OpenVINO 2026.4 has no MaxUnpool
    Case("CumSum", [rand(2, 5), np.array(1)], lambda x, a: x.cumsum(1)),
    Case("CumSum", [rand(2, 5), np.array(-1)], lambda x, a: x.flip(1).cumsum(1).flip(1), {"reverse": 1}),
    Case("CumSum", [rand(2, 5), np.array(0)], lambda x, a: x.flip(0).cumsum(0).flip(0) - x,
         {"reverse": 1, "exclusive": 1}),
]


@pytest.mark.parametrize("case", POOLS, ids=repr)
def test_pool(case: Case) -> None:
    check(case)


def test_lp_pool_dilated_ceil_mode() -> None:
    """Opset 18's dilations and ceil_mode (torch's lp_pool has neither): finite differences, and onnxruntime's
    float32 gradient against the reference runtime's float64 one."""
    case = Case("LpPool", [rand(1, 2, 7, 6)], None,
                {"kernel_shape": [2, 2], "dilations": [2, 1], "strides": [2, 2], "ceil_mode": 1, "p": 3}, opset=18)
    check_finite_differences(case)
    wide, narrow = case_model(case, np.float64), case_model(case, np.float32)
    expected = reference(step_as_proto(wide, loss="sum", freeze=probes(wide)).model).run(["grad.in0"], {})[0]
    got = run_ort(step_as_proto(narrow, loss="sum", freeze=probes(narrow)).model)["grad.in0"]
    assert rel_err(got, expected) < TORCH_TOLERANCE


# Data movement.

SHAPES = [
    Case("Flatten", [rand(2, 3, 4, 5)], lambda x: x.flatten(0, 1).flatten(1), {"axis": 2}),
    Case("Reshape", [rand(2, 3, 4), ints(4, -1)], lambda x, s: x.reshape(4, -1)),
    Case("Trilu", [rand(3, 4)], lambda x: x.triu()),
    Case("Trilu", [rand(2, 3, 4), np.array(1)], lambda x, k: x.tril(1), {"upper": 0}),
    Case("Transpose", [rand(2, 3, 4)], lambda x: x.permute(2, 0, 1), {"perm": [2, 0, 1]}),
    Case("Transpose", [rand(2, 3, 4)], lambda x: x.permute(2, 1, 0)),
    Case("Squeeze", [rand(2, 1, 4), ints(1)], lambda x, a: x.squeeze(1)),
    Case("Unsqueeze", [rand(2, 4), ints(0, 2)], lambda x, a: x.unsqueeze(0).unsqueeze(2)),
    Case("Concat", [rand(2, 3), rand(2, 1), rand(2, 4)], lambda *xs: torch.cat(xs, 1), {"axis": 1}),
    Case("Concat", [rand(2, 3), rand(1, 3)], lambda *xs: torch.cat(xs, -2), {"axis": -2}),
    Case("Split", [rand(2, 6), ints(1, 2, 3)], lambda x, s: torch.split(x, [1, 2, 3], 1), {"axis": 1}, n_out=3),
    Case("Split", [rand(4, 3)], lambda x: torch.split(x, 2, 0), {"axis": 0}, n_out=2),
    Case("Slice", [rand(5, 6), ints(1, -4), ints(4, 100), ints(0, 1)], lambda x, *_: x[1:4, -4:]),
    Case("Slice", [rand(5, 6), ints(4, 0), ints(-100, 6), ints(0, 1), ints(-2, 3)], lambda x, *_: x.flip(0)[::2, ::3]),
    Case("Pad", [rand(2, 3, 4), ints(0, 1, 2, 0, 2, 1)], lambda x, p: F.pad(x, [2, 1, 1, 2])),
    Case("Tile", [rand(2, 3), ints(2, 3)], lambda x, r: x.repeat(2, 3)),
    Case("Pad", [rand(2, 3, 4), ints(0, -1, 2, 0, 1, -1)], lambda x, p: F.pad(x, [2, -1, -1, 1]),
         finite_differences=False),
    Case("Squeeze", [rand(2, 1, 4), ints(1)], lambda x, a: x.squeeze(1), opset=20),
    Case("Split", [rand(2, 6), ints(1, 2, 3)], lambda x, s: torch.split(x, [1, 2, 3], 1), {"axis": 1}, n_out=3,
         opset=20),
    # Indexing: repeated and negative indices accumulate into the same rows.
    Case("Gather", [rand(5, 3), ints(0, 2, 2, -1)], lambda x, i: x[[0, 2, 2, 4]]),
    Case("Gather", [rand(2, 5, 3), np.array([[1, 1], [4, 0]])], lambda x, i: x[:, torch.tensor([[1, 1], [4, 0]])],
         {"axis": 1}),
    Case("Gather", [rand(2, 5, 3), np.array(3)], lambda x, i: x[:, 3], {"axis": 1}, opset=20),
    Case("GatherElements", [rand(3, 4), np.array([[0, 3], [1, 1], [2, 0]])],
         lambda x, i: torch.gather(x, 1, torch.tensor([[0, 3], [1, 1], [2, 0]])), {"axis": 1}),
    Case("GatherND", [rand(3, 4, 5), np.array([[0, 1], [2, -1], [0, 1]])], lambda x, i: x[[0, 2, 0], [1, 3, 1]]),
    Case("GatherND", [rand(3, 4, 5), np.array([[[2]], [[0]]])], lambda x, i: x[torch.tensor([[2], [0]])], opset=20),
    # ScatterND writes over data (whose gradient is zero there) or adds to it; updates get dy where they went.
    Case("ScatterND", [rand(4, 3), np.array([[1], [3]]), rand(2, 3)],
         lambda d, i, u: d.index_put((torch.tensor([1, 3]),), u)),
    Case("ScatterND", [rand(4, 3), np.array([[1, 2], [1, 2], [0, 0]]), rand(3)],
         lambda d, i, u: d.index_put((torch.tensor([1, 1, 0]), torch.tensor([2, 2, 0])), u, accumulate=True),
         {"reduction": "add"}, opset=18),
    # ScatterElements (torch.scatter, scatter_add): written-over data gets no gradient; added-to data all of it.
    Case("ScatterElements", [rand(3, 4), np.array([[1, 0], [3, 2], [0, -1]]), rand(3, 2)],
         lambda d, i, u: d.scatter(1, torch.tensor([[1, 0], [3, 2], [0, 3]]), u), {"axis": 1}),
    Case("ScatterElements", [rand(4, 3), np.array([[1, 2, 1], [1, 0, 3]]), rand(2, 3)],
         lambda d, i, u: d.scatter_add(0, torch.tensor(i), u), {"reduction": "add"}, opset=18),
    Case("ScatterElements", [rand(4, 3), np.array([[1, 2, 1]]), rand(1, 3)],
         lambda d, i, u: d.scatter(0, torch.tensor(i), u), opset=13),
    Case("TopK", [rand(3, 6), ints(2)], lambda x, k: x.topk(2, dim=1).values, {"axis": 1}, n_out=2),
    Case("TopK", [rand(4, 3), ints(3)], lambda x, k: x.topk(3, dim=0, largest=False).values,
         {"axis": 0, "largest": 0}, n_out=2),
    Case("ReverseSequence", [rand(4, 3, 2), np.array([4, 1, 3])],
         lambda x, n: torch.stack([torch.cat([x[:k, b].flip(0), x[k:, b]]) for b, k in enumerate([4, 1, 3])], 1)),
    Case("ReverseSequence", [rand(3, 5), np.array([2, 5, 0])],
         lambda x, n: torch.stack([torch.cat([x[b, :k].flip(0), x[b, k:]]) for b, k in enumerate([2, 5, 0])]),
         {"batch_axis": 0, "time_axis": 1}),
    Case("Col2Im", [rand(2, 3 * 4, 12), ints(4, 5), ints(2, 2)], lambda x, *_: F.fold(x, (4, 5), 2), opset=18),
    Case("Col2Im", [rand(1, 2 * 6, 6), ints(5, 6), ints(2, 3)],
         lambda x, *_: F.fold(x, (5, 6), (2, 3), dilation=(1, 2), padding=(1, 0), stride=(2, 1)),
         {"dilations": [1, 2], "pads": [1, 0, 1, 0], "strides": [2, 1]}, opset=18),
    Case("DepthToSpace", [rand(2, 8, 2, 3)], lambda x: x.view(2, 2, 2, 2, 2, 3).permute(0, 3, 4, 1, 5, 2)
         .reshape(2, 2, 4, 6), {"blocksize": 2}),
    Case("DepthToSpace", [rand(2, 8, 2, 3)], lambda x: F.pixel_shuffle(x, 2), {"blocksize": 2, "mode": "CRD"}),
    Case("SpaceToDepth", [rand(2, 3, 4, 6)], lambda x: x.view(2, 3, 2, 2, 3, 2).permute(0, 3, 5, 1, 2, 4)
         .reshape(2, 12, 2, 3), {"blocksize": 2}),
]


@pytest.mark.parametrize("case", SHAPES, ids=repr)
def test_shape(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("op", ["Gather", "GatherND"])
@pytest.mark.parametrize(("rows", "width"), [(4, 4096), (100, 512)], ids=["one-hot", "scatter"])
def test_gather_gradient_exact_on_many_threads(op: str, rows: int, width: int) -> None:
    """1024 picks of `rows` rows summed into the loss: each row's gradient is how often it was picked, exactly, on 4
    onnxruntime threads in each of 30 runs. Scattered with ScatterND (reduction add), whose CPU kernel adds rows on
    several threads unsynchronised, picks were lost and runs differed (microsoft/onnxruntime#18048)."""
    picked = np.random.default_rng(0).integers(0, rows, 1024)
    picks = picked if op == "Gather" else picked[:, None]
    initializers = [numpy_helper.from_array(rand(rows, width), "table"), numpy_helper.from_array(picks, "picks")]
    graph = helper.make_graph([helper.make_node(op, ["table", "picks"], ["output"])], "picks", [],
                              [onnx.ValueInfoProto(name="output")], initializers)
    step = step_as_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), loss="sum").model
    session = ort_session(step, threads=4)  # as onnx-remat runs it: no constant folding of the gradient
    expected = np.repeat(np.bincount(picked, minlength=rows)[:, None], width, axis=1)
    for _ in range(30):  # before, 1 to 3 runs in 20 lost picks on 2 cores
        np.testing.assert_array_equal(session.run(["grad.table"], {})[0], expected)


def resize_case(mode: str, size: tuple[int, int], torch_mode: str, opset: int = 17, **attrs) -> Case:
    """Resize of a (2, 3, 4, 5) input to `size` given as sizes (scales would be cast to float64 with the input)."""
    x, sizes = rand(2, 3, 4, 5), ints(2, 3, *size)
    align = {"align_corners": attrs.get("coordinate_transformation_mode") == "align_corners"}
    torch_fn = lambda x, *_: F.interpolate(x, size=size, mode=torch_mode, **({} if torch_mode == "nearest" else align))  # noqa: E731
    if "axes" in attrs:
        sizes = ints(*size)
    return Case("Resize", [x, None, None, sizes], torch_fn, {"mode": mode, **attrs}, opset=opset)


RESIZES = [
    resize_case("linear", (8, 10), "bilinear"),
    resize_case("linear", (7, 3), "bilinear", coordinate_transformation_mode="align_corners"),
    resize_case("nearest", (8, 15), "nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    resize_case("linear", (6, 10), "bilinear", opset=19, axes=[2, 3]),
]


@pytest.mark.parametrize("case", RESIZES, ids=repr)
def test_resize(case: Case) -> None:
    check(case)


GRID = np.random.default_rng(3).uniform(-1.2, 1.2, (2, 3, 4, 2))  # some samples outside the image (zero padding)

GRID_SAMPLES = [  # onnx's reference GridSample is off by 2e-7 in float64 (from torch's): no finite differences
    Case("GridSample", [rand(2, 3, 4, 5), GRID], lambda x, g: F.grid_sample(x, g, align_corners=False), opset=16,
         finite_differences=False),
    Case("GridSample", [rand(2, 3, 4, 5), GRID], lambda x, g: F.grid_sample(x, g, align_corners=True),
         {"align_corners": 1}, opset=16, finite_differences=False),
    Case("GridSample", [rand(1, 2, 5, 3), GRID[:1]], lambda x, g: F.grid_sample(x, g, align_corners=False),
         {"mode": "linear"}, opset=20, finite_differences=False),
    # onnx's reference AffineGrid answers float32 for float64 theta: no finite differences.
    Case("AffineGrid", [rand(2, 2, 3), ints(2, 3, 4, 5)], lambda t, s: F.affine_grid(t, [2, 3, 4, 5], False),
         opset=20, finite_differences=False),
    Case("AffineGrid", [rand(2, 2, 3), ints(2, 1, 3, 2)], lambda t, s: F.affine_grid(t, [2, 1, 3, 2], True),
         {"align_corners": 1}, opset=20, finite_differences=False),
    Case("AffineGrid", [rand(1, 3, 4), ints(1, 1, 2, 3, 4)], lambda t, s: F.affine_grid(t, [1, 1, 2, 3, 4], False),
         opset=20, finite_differences=False),
]


@pytest.mark.parametrize("case", GRID_SAMPLES, ids=repr)
def test_grid_sample(case: Case) -> None:
    check(case)


def test_grid_sample_nearest_is_refused_naming_the_node() -> None:
    model = case_model(Case("GridSample", [rand(1, 1, 3, 3), GRID[:1]], None, {"mode": "nearest"}, opset=16),
                       np.float32)
    with pytest.raises(ModelError, match="GridSample 'op'.*'nearest'"):
        step_as_proto(model, loss="sum", freeze=probes(model))


def test_resize_cropping_is_refused_naming_the_node() -> None:
    case = resize_case("linear", (8, 10), "bilinear", coordinate_transformation_mode="tf_crop_and_resize")
    model = case_model(case, np.float32)
    with pytest.raises(ModelError, match="Resize 'op'.*tf_crop_and_resize"):
        step_as_proto(model, loss="sum", freeze=probes(model))


def einsum_case(equation: str, *shapes: tuple[int, ...]) -> Case:
    inputs = [rand(*shape, seed=k) for k, shape in enumerate(shapes)]
    return Case("Einsum", inputs, lambda *xs: torch.einsum(equation, *xs), {"equation": equation})


EINSUMS = [
    einsum_case("bij,bjk->bik", (2, 3, 4), (2, 4, 5)),
    einsum_case("bhqd,bhkd->bhqk", (2, 2, 3, 4), (2, 2, 5, 4)),  # attention scores as exporters write them
    einsum_case("ij->ji", (3, 4)),
    einsum_case("ij->i", (3, 4)),  # j only in the operand: broadcast back
    einsum_case("ij,k->ik", (3, 4), (5,)),
    einsum_case("ij,j->", (3, 4), (4,)),
    einsum_case("ij->", (3, 4)),
    einsum_case("ij,jk", (3, 4), (4, 5)),  # implicit output
    einsum_case("...ij,...jk->...ik", (2, 3, 4), (2, 4, 5)),
    einsum_case("b i d, b j d -> b i j", (2, 3, 4), (2, 5, 4)),
]


@pytest.mark.parametrize("case", EINSUMS, ids=lambda c: c.attrs["equation"])
def test_einsum(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("equation, shapes, reason", [("ii->i", [(3, 3)], "repeats"),
                                                      ("ij,ij->i", [(3, 4), (1, 4)], "broadcasts")])
def test_einsum_without_a_rule_is_refused_naming_the_node(equation, shapes, reason) -> None:
    model = case_model(einsum_case(equation, *shapes), np.float32)
    with pytest.raises(ModelError, match=f"Einsum 'op'.*{reason}"):
        step_as_proto(model, loss="sum", freeze=probes(model))


def test_every_rule_is_tested() -> None:
    cases = ELEMENTWISE + DETS + NORMS + LOSSES + POOLS + SHAPES + RESIZES + GRID_SAMPLES + EINSUMS
    tested = {c.op for c in cases} | {"Gemm", "MatMul", "Conv", "ConvTranspose"}
    tested |= {op for op, rule in RULES.items() if rule is NO_GRADIENT}  # test_autodiff_no_gradient.py
    tested |= {"DFT", "STFT"}  # test_autodiff_spectral.py
    tested |= {"RoiAlign", "MaxRoiPool"}  # test_autodiff_roi.py
    tested |= {"If"}  # test_autodiff_control_flow.py
    assert set(RULES) <= tested, sorted(set(RULES) - tested)


def test_dropout_uses_the_mask() -> None:
    """Training-mode dropout: the gradient is probe * mask / (1 - ratio) for the mask of the same run."""
    case = Case("Dropout", [rand(4, 50), np.array(0.25)], None)
    model = case_model(case, np.float32)
    training = step_as_proto(model, loss="sum", freeze=probes(model))
    training.model.graph.output.append(helper.make_tensor_value_info("op.mask", TensorProto.BOOL, [4, 50]))
    got = run_ort(training.model)
    probe = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "probe0"))
    assert 0 < got["op.mask"].mean() < 1
    np.testing.assert_allclose(got["grad.in0"], probe * got["op.mask"] / 0.75, rtol=1e-6)


def test_clip_by_computed_bounds() -> None:
    """torch.clamp(w, min=mean(w) - 0.3, max=mean(w) + 0.3): dy reaches w directly where it is inside and through the
    mean where it is clipped, as the legacy exporter writes it (Clip with computed bounds)."""
    w = rand(3, 4)
    nodes = [helper.make_node("ReduceMean", ["w"], ["mean"], keepdims=0),
             helper.make_node("Sub", ["mean", "width"], ["low"]), helper.make_node("Add", ["mean", "width"], ["high"]),
             helper.make_node("Clip", ["w", "low", "high"], ["clipped"], name="op"),
             helper.make_node("Mul", ["clipped", "probe"], ["output"])]
    probe = rand(3, 4, seed=5)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (("w", w), ("probe", probe))]
    inits.append(numpy_helper.from_array(np.array(0.3, np.float32), "width"))
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("output", TensorProto.FLOAT, [3, 4])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    training = step_as_proto(model, loss="sum", freeze=["probe", "width"])
    weights = torch.tensor(w, requires_grad=True)
    (torch.clamp(weights, weights.mean() - 0.3, weights.mean() + 0.3) * torch.tensor(probe)).sum().backward()
    assert rel_err(run_ort(training.model)["grad.w"], weights.grad.numpy()) < TORCH_TOLERANCE


def test_unsupported_ops_are_listed_once() -> None:
    nodes = [helper.make_node("CenterCropPad", ["w", "size"], ["a"], name="crop"),
             helper.make_node("CenterCropPad", ["a", "size"], ["b"]),
             helper.make_node("DeformConv", ["b", "kernel", "offset"], ["output"], name="deform")]
    output = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1, 2, 2])
    inits = [numpy_helper.from_array(rand(1, 1, 3, 3).astype(np.float32), "w"),
             numpy_helper.from_array(ints(1, 1, 3, 3), "size"),
             numpy_helper.from_array(rand(1, 1, 2, 2).astype(np.float32), "kernel"),
             numpy_helper.from_array(np.zeros((1, 8, 2, 2), np.float32), "offset")]
    graph = helper.make_graph(nodes, "g", [], [output], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=10)
    with pytest.raises(ModelError, match=r"CenterCropPad \(e.g. node 'crop'\); DeformConv \(e.g. node 'deform'\)$"):
        step_as_proto(model, loss="sum", freeze=["kernel", "offset"])


def rotate_half_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                          ) -> torch.Tensor:
    """RotaryEmbedding-23 on (batch, heads, sequence, head size), not interleaved, by rotate_half."""
    cos, sin = torch.cat([cos, cos], -1)[positions].unsqueeze(1), torch.cat([sin, sin], -1)[positions].unsqueeze(1)
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


POSITIONS = ints(0, 1, 2, 3, 4, 4, 3, 2, 1, 0).reshape(2, 5)
"""Position ids in another order per row."""

# Opset 23's ops with a function body and no rule are differentiated as their body's ops.
FUNCTION_OPS = [
    # Grouped-query causal attention: 4 query heads, 2 key/value heads, each serving two neighbouring query heads.
    Case("Attention", [rand(2, 4, 5, 6), rand(2, 2, 5, 6), rand(2, 2, 5, 6)],
         lambda q, k, v: F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                         is_causal=True),
         {"is_causal": 1}, opset=23),
    # (batch, sequence, heads x head size) with an additive mask and a scale.
    Case("Attention", [rand(2, 5, 12), rand(2, 4, 12), rand(2, 4, 8), rand(5, 4)],
         lambda q, k, v, mask: F.scaled_dot_product_attention(
             *(z.reshape(2, -1, 2, z.shape[-1] // 2).transpose(1, 2) for z in (q, k, v)), mask, scale=0.3,
         ).transpose(1, 2).reshape(2, 5, 8),
         {"q_num_heads": 2, "kv_num_heads": 2, "scale": 0.3}, opset=23),
    # RotaryEmbedding has no float64 form: no finite differences.
    Case("RotaryEmbedding", [rand(2, 3, 5, 6), rand(5, 3), rand(5, 3), POSITIONS],
         rotate_half_embedding, finite_differences=False, opset=23),
]


@pytest.mark.parametrize("case", FUNCTION_OPS, ids=repr)
def test_function_ops(case: Case) -> None:
    """No rule of its own: the training step differentiates the body, against finite differences and autograd."""
    assert case.op not in RULES
    check(case)
