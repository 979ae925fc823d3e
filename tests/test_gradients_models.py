"""Every bundled network and exported fixture: training-graph gradients vs the torch oracle, OpenVINO vs
onnxruntime, and the SGD step vs torch.optim.SGD.

Train-mode BatchNorm makes MobileNetV2 ill-conditioned in float32 (even PyTorch's own float32 gradients are
~2e-4 off its float64 ones), so its graph is built and run in float64; onnxruntime has no double Conv, so the
ONNX reference runtime runs it.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from conftest import step_as_proto
from onnx import TensorProto, numpy_helper
from onnx.reference import ReferenceEvaluator
from test_autodiff_rules import run_openvino, run_ort
from torch_oracle import leaves, loss_value, reference, run_forward, tensor

from onnx_remat.core.errors import UsageError
from onnx_remat.models import FIXTURES, MODELS
from onnx_remat.passes.autodiff import TrainingGraph
from onnx_remat.passes.operator_groups import check_topological, training_groups

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from real_models import to_double  # noqa: E402

TOLERANCE = 1e-4
ZERO_FLOOR = 1e-3  # exactly-zero gradients are compared against this fraction of the model's largest gradient


@dataclass(frozen=True)
class Case:
    """A network to check: a registered builder (with small sizes) or an exported fixture, and its loss."""

    source: str
    loss: str
    kwargs: dict[str, int | float] = field(default_factory=dict)
    float64: bool = False  # ill-conditioned in float32: compare the float64 graph instead
    slow: bool = False

    def model(self) -> onnx.ModelProto:
        """The forward model."""
        if self.source in MODELS:
            return MODELS[self.source](**self.kwargs)
        return onnx.load(str(FIXTURES / f"{self.source}.onnx"))


CASES: dict[str, Case] = {
    "vgg16": Case("vgg16", "cross-entropy", {"batch": 2}),
    "vgg19": Case("vgg19", "cross-entropy", {"batch": 2}, slow=True),
    "resnet18": Case("resnet18", "cross-entropy", {"batch": 2}),
    "resnet34": Case("resnet34", "cross-entropy", {"batch": 2}, slow=True),
    "unet": Case("unet", "mse", {"batch": 2, "resolution": 32}),
    "mobilenet_v2": Case("mobilenet_v2", "cross-entropy", {"batch": 2}, float64=True, slow=True),
    "transformer_encoder": Case("transformer_encoder", "mse", {"batch": 2, "seq_len": 8, "d_model": 32}),
    "wavenet": Case("wavenet", "sum", {"batch": 2, "length": 128}),
    **{path.stem: Case(path.stem, "cross-entropy" if "resnet" in path.stem else "mse", slow=True)
       for path in sorted(FIXTURES.glob("*.onnx"))},
}


def feeds(model: onnx.ModelProto, loss: str) -> dict[str, np.ndarray]:
    """Seeded standard-normal inputs in the graph's float type; class labels for cross-entropy."""
    rng = np.random.default_rng(0)
    classes = model.graph.output[0].type.tensor_type.shape.dim[-1].dim_value
    out = {}
    for value in model.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if value.type.tensor_type.elem_type == TensorProto.INT64:
            out[value.name] = rng.integers(0, classes, shape)
        else:
            dtype = np.float64 if value.type.tensor_type.elem_type == TensorProto.DOUBLE else np.float32
            out[value.name] = rng.standard_normal(shape).astype(dtype)
    return out


def run_reference(model: onnx.ModelProto, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """All outputs of a model run by the ONNX reference runtime (any float type)."""
    results = ReferenceEvaluator(model).run(None, data)
    return dict(zip([o.name for o in model.graph.output], results, strict=True))


@dataclass(frozen=True)
class Run:
    """A case's forward model, its training graph, the inputs fed, and the outputs of one runtime."""

    model: onnx.ModelProto
    graph: TrainingGraph
    data: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]


@functools.cache
def run_case(name: str, float64: bool) -> Run:
    """Build the case's training graph and run it: onnxruntime in float32, the reference runtime in float64."""
    case = CASES[name]
    model = to_double(case.model()) if float64 else case.model()
    graph = step_as_proto(model, loss=case.loss)
    data = feeds(graph.model, case.loss)
    runtime: Callable = run_reference if float64 else run_ort
    return Run(model, graph, data, runtime(graph.model, data))


def relative_errors(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> dict[str, float]:
    """max|got - expected| / max|expected| per tensor, the denominator floored for exactly-zero gradients."""
    floor = ZERO_FLOOR * max(float(np.abs(v).max()) for k, v in expected.items() if k.startswith("grad."))
    return {k: float(np.abs(got[k] - v).max()) / max(float(np.abs(v).max()), floor, 1e-30)
            for k, v in expected.items()}


def torch_errors(name: str, float64: bool) -> dict[str, float]:
    """Relative error of the loss and every gradient against the torch oracle."""
    run = run_case(name, float64)
    expected = reference(run.model, run.data, CASES[name].loss, run.graph.parameters)
    return relative_errors(run.outputs, expected)


def openvino_errors(name: str) -> dict[str, float]:
    """Relative difference of every float32 gradient, OpenVINO vs onnxruntime."""
    run = run_case(name, False)
    ours = {g: run.outputs[g] for g in run.graph.gradients}
    return relative_errors(run_openvino(run.graph.model, run.data), ours)


def has_dropout(name: str) -> bool:
    """Whether the case's model contains Dropout (OpenVINO cannot load its training form)."""
    return any(n.op_type == "Dropout" for n in run_case(name, False).model.graph.node)


def _params(names: list[str]) -> list:
    return [pytest.param(n, marks=pytest.mark.slow) if CASES[n].slow else n for n in names]


@pytest.mark.parametrize("name", _params(list(CASES)))
def test_gradients_match_torch(name: str) -> None:
    """Loss and every parameter gradient agree with torch autograd on the same forward graph."""
    errors = torch_errors(name, CASES[name].float64)
    assert "loss" in errors and len(errors) == len(run_case(name, CASES[name].float64).graph.parameters) + 1
    worst = max(errors, key=errors.get)
    assert errors[worst] <= TOLERANCE, f"{worst} off by {errors[worst]:.2e}"


@pytest.mark.parametrize("name", _params([n for n, c in CASES.items() if not c.float64]))
def test_openvino_matches_onnxruntime(name: str) -> None:
    """The same float32 training graph gives the same gradients in OpenVINO as in onnxruntime."""
    if has_dropout(name):
        pytest.skip("OpenVINO cannot load training-mode Dropout")
    errors = openvino_errors(name)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= TOLERANCE, f"{worst} off by {errors[worst]:.2e}"


def torch_sgd_step(model: onnx.ModelProto, data: dict[str, np.ndarray], loss: str, parameters: tuple[str, ...],
                   lr: float) -> dict[str, np.ndarray]:
    """The parameters after one torch.optim.SGD step on the oracle's loss."""
    values = leaves(model, parameters)
    inputs = {k: tensor(v) for k, v in data.items()}
    output = run_forward(model, {**values, **inputs})[model.graph.output[0].name]
    optimizer = torch.optim.SGD([values[p] for p in parameters], lr=lr)
    loss_value(output, inputs.get("label"), loss).backward()
    optimizer.step()
    return {p: values[p].detach().numpy() for p in parameters}


def test_sgd_step_matches_torch_optim() -> None:
    """`<param>.updated` is torch.optim.SGD's step; the update nodes join the backward groups."""
    model, lr = MODELS["resnet18"](batch=2), 0.5
    graph = step_as_proto(model, loss="cross-entropy", optimizer="sgd", lr=lr)
    data = feeds(graph.model, "cross-entropy")
    got = run_ort(graph.model, data)
    expected = torch_sgd_step(model, data, "cross-entropy", graph.parameters, lr)
    outputs = [o.name for o in graph.model.graph.output]
    assert outputs[-2 * len(graph.parameters):] == [*graph.gradients, *graph.updates]
    assert graph.updates == tuple(f"{p}.updated" for p in graph.parameters)
    initial = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for param, grad, update in zip(graph.parameters, graph.gradients, graph.updates, strict=True):
        np.testing.assert_allclose(got[update], initial[param] - np.float32(lr) * got[grad], rtol=1e-6, atol=1e-7)
        error = np.abs(got[update] - expected[param]).max() / np.abs(expected[param]).max()
        assert error <= 1e-5, f"{update} off by {error:.2e}"
    grouped = {n for names in graph.backward_groups.values() for n in names}
    assert {f"sgd/{p}" for p in graph.parameters} <= grouped
    ir_graph = ir.serde.deserialize_model(graph.model).graph
    check_topological(ir_graph, training_groups(ir_graph, graph.backward_groups))


def test_sgd_rejects_bad_arguments() -> None:
    model = MODELS["vgg16"](batch=2)
    with pytest.raises(UsageError, match="unknown optimizer 'adam'"):
        step_as_proto(model, loss="sum", optimizer="adam")
    with pytest.raises(UsageError, match="learning rate"):
        step_as_proto(model, loss="sum", optimizer="sgd", lr=float("nan"))
    assert step_as_proto(model, loss="sum").updates == ()


I64 = np.int64
ORACLE_OPS = {  # ops no bundled network uses: the oracle's forward must still agree with onnxruntime
    "AveragePool": ([], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "Slice": ([np.array([1, -1], I64), np.array([4, 0], I64), np.array([2, 3], I64), np.array([2, -2], I64)], {}),
    "Split": ([np.array([2, 4], I64)], {"axis": 3}),
    "Pad": ([np.array([0, 0, 1, 2, 0, 1, 0, 1], I64), np.array(0.5, np.float32)], {}),
    "Gather": ([np.array([[0, -1], [2, 1]], I64)], {"axis": 2}),
    "Squeeze": ([np.array([0], I64)], {}),
    "Unsqueeze": ([np.array([-1, 1], I64)], {}),
    "ReduceMean": ([], {"axes": [1, 3], "keepdims": 0}),
    "ReduceSum": ([np.array([-1], I64)], {}),
    "Pow": ([np.array(2.0, np.float32)], {}),
    "Sqrt": ([], {}),
    "Softmax": ([], {"axis": 1}),
    "LogSoftmax": ([], {"axis": 2}),
    "Cast": ([], {"to": TensorProto.DOUBLE}),
    "Shape": ([], {"start": 1}),
}


@pytest.mark.parametrize("op", list(ORACLE_OPS))
def test_oracle_forward_matches_onnxruntime(op: str) -> None:
    """One node on a [1, 3, 5, 6] input: the oracle's torch translation vs onnxruntime."""
    extra, attrs = ORACLE_OPS[op]
    x = np.abs(np.random.default_rng(1).standard_normal((1, 3, 5, 6))).astype(np.float32)
    inits = [numpy_helper.from_array(v, f"in{k}") for k, v in enumerate(extra, start=1)]
    node = onnx.helper.make_node(op, ["x", *(i.name for i in inits)], ["y"] if op != "Split" else ["y", "z"], **attrs)
    graph = onnx.helper.make_graph([node], "g", [onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                                   [onnx.helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None)
                                    for o in node.output], inits)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=10)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    expected = run_ort(model, {"x": x})
    got = run_forward(model, {**leaves(model, ()), "x": tensor(x)})
    for name, value in expected.items():
        np.testing.assert_allclose(got[name].numpy(), value, rtol=1e-5, atol=1e-6)
