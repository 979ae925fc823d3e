"""Shape resolution for fixed input shapes: inference, folded shape subgraphs, onnxruntime as the last resort."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from onnx_remat import run_on_devices
from onnx_remat.cli.main import main
from onnx_remat.core.errors import ModelError
from onnx_remat.passes.execute import random_feeds, run
from onnx_remat.passes.load import read_graph
from onnx_remat.passes.manager import to_proto
from onnx_remat.passes.shapes import is_concrete, resolve_shapes
from onnx_remat.pipeline import remat

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from real_model_zoo import export  # noqa: E402

IN_GRAPH_SHAPES = ("shufflenet_v2_x1_0", "vit", "gpt_mha")
"""Legacy exports whose shapes are computed inside the graph (Shape -> Gather -> Slice/Reshape/Pad): ONNX inference
alone left tensors of each without a size."""


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], out_shape: list | None = None,
           ) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _shape_of(model: onnx.ModelProto, name: str) -> list[int]:
    value = next(v for v in [*model.graph.value_info, *model.graph.output] if v.name == name)
    assert is_concrete(value)
    return [d.dim_value for d in value.type.tensor_type.shape.dim]


def test_a_shape_computed_through_a_parameter_is_found_by_running_the_model() -> None:
    """The target shape reads a float parameter's values: never folded, so onnxruntime tells the size."""
    nodes = [
        helper.make_node("ReduceSum", ["w"], ["w_sum"], keepdims=0),
        helper.make_node("Cast", ["w_sum"], ["rows"], to=TensorProto.INT64),
        helper.make_node("Unsqueeze", ["rows", "axis0"], ["rows1"]),
        helper.make_node("Concat", ["rows1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([1.0, 3.0], np.float32), "w"), _ints("axis0", [0]), _ints("minus1", [-1])]
    resolved = resolve_shapes(_model(nodes, inits))
    assert _shape_of(resolved, "r") == [4, 6]
    assert [i.name for i in resolved.graph.initializer] == ["w", "axis0", "minus1"]  # nothing folded into the model


def test_shape_subgraphs_are_folded_and_the_model_keeps_its_nodes() -> None:
    """Shape -> Gather -> Mul -> Concat -> Reshape, as exporters write a flatten of the last two axes."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i1"], ["d1"], axis=0),
        helper.make_node("Gather", ["s", "i2"], ["d2"], axis=0),
        helper.make_node("Mul", ["d1", "d2"], ["d12"]),
        helper.make_node("Unsqueeze", ["d12", "axis0"], ["d12v"]),
        helper.make_node("Concat", ["minus1", "d12v"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [_ints("i1", 1), _ints("i2", 2), _ints("axis0", [0]), _ints("minus1", [-1])]
    model = _model(nodes, inits)
    resolved = resolve_shapes(model)
    assert _shape_of(resolved, "y") == [2, 12]
    assert [n.op_type for n in resolved.graph.node] == [n.op_type for n in model.graph.node]


def test_a_value_dependent_shape_is_refused_naming_its_node() -> None:
    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"], name="where_positive"),
        helper.make_node("Transpose", ["nz"], ["t"]),
        helper.make_node("Cast", ["t"], ["y"], to=TensorProto.FLOAT),
    ]
    with pytest.raises(ModelError, match="NonZero node 'where_positive'"):
        resolve_shapes(_model(nodes, []))


def test_a_value_dependent_op_on_constants_has_its_shape_found() -> None:
    """A NonZero of a constant mask (wav2vec 2.0's time mask, drawn at export: more elements than the folder takes)
    has one fixed shape: running the model finds it."""
    mask = np.zeros((2, 79, 64), bool)
    mask[1, 3:8, 0] = True
    nodes = [
        helper.make_node("NonZero", ["mask"], ["nz"], name="masked"),
        helper.make_node("Transpose", ["nz"], ["where"]),
        helper.make_node("GatherND", ["x", "where"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 79, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(mask, "mask")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    assert _shape_of(resolve_shapes(model), "y") == [5]


@pytest.mark.parametrize("op_type, weight_shape, group", [("Conv", [4, 2, 1], 1), ("Conv", [4, 1, 1], 2),
                                                          ("ConvTranspose", [2, 4, 1], 1)])
def test_a_convolution_whose_input_channels_differ_from_its_weights_is_refused(op_type, weight_shape, group) -> None:
    weight = numpy_helper.from_array(np.ones(weight_shape, np.float32), "w")
    nodes = [helper.make_node(op_type, ["x", "w"], ["y"], name="mixer", group=group)]
    with pytest.raises(ModelError, match=f"{op_type} node 'mixer' reads 'x' with 3 channels"):
        resolve_shapes(_model(nodes, [weight]))


def _reshaped_by_a_parameter() -> onnx.ModelProto:
    """A model whose Reshape target is computed from a parameter's values: only running it tells the sizes."""
    nodes = [
        helper.make_node("ReduceSum", ["w"], ["w_sum"], keepdims=0),
        helper.make_node("Cast", ["w_sum"], ["rows"], to=TensorProto.INT64),
        helper.make_node("Unsqueeze", ["rows", "axis0"], ["rows1"]),
        helper.make_node("Concat", ["rows1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Tanh", ["r"], ["a"]),
        helper.make_node("Sigmoid", ["a"], ["b"]),
        helper.make_node("Mul", ["a", "b"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([1.0, 3.0], np.float32), "w"), _ints("axis0", [0]), _ints("minus1", [-1])]
    return _model(nodes, inits, [4, 6])


def test_a_model_whose_shapes_only_running_finds_is_rewritten_to_the_same_outputs() -> None:
    """End to end: the model runs the same after the rewrite at the smallest budget."""
    model = _reshaped_by_a_parameter()
    result = remat(model, budget="min", time_limit=10)
    feeds = random_feeds(model)
    np.testing.assert_allclose(run(result.model, feeds)[0], run(model, feeds)[0], rtol=1e-6)


def test_a_two_device_rewrite_of_such_a_model_runs_on_its_devices() -> None:
    """`onnx-remat run` once failed with a KeyError on a tensor inference alone leaves without a size."""
    model = _reshaped_by_a_parameter()
    result = remat(model, budget="100%", devices="ort-cpu+ov-cpu", cost_model="analytic", time_limit=10)
    feeds = random_feeds(model)
    ran = run_on_devices(result.model, "ort-cpu+ov-cpu", feeds, repeats=1, measure_memory=False)
    np.testing.assert_allclose(ran.outputs["y"], run(model, feeds)[0], rtol=1e-6)


@pytest.fixture(scope="module")
def legacy_export(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Export a model of the matrix once per module with PyTorch's legacy exporter (opset 17)."""
    folder = tmp_path_factory.mktemp("legacy")
    paths: dict[str, Path] = {}

    def exported(name: str) -> Path:
        if name not in paths:
            paths[name] = export(name, "legacy", folder / f"{name}.onnx")
        return paths[name]

    return exported


def _observed_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Every node output's shape as onnxruntime computes it on random inputs."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    declared = {o.name for o in model.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=out) for node in model.graph.node for out in node.output
                              if out and out not in declared)
    values = run(probe, random_feeds(model))
    return {o.name: list(v.shape) for o, v in zip(probe.graph.output, values, strict=True)}


def _resolved_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    graph = model.graph
    return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*graph.value_info, *graph.output] if is_concrete(v)}


@pytest.mark.parametrize("name", IN_GRAPH_SHAPES)
def test_in_graph_shapes_of_exported_models_resolve_to_what_onnxruntime_computes(
        name: str, legacy_export: Callable[[str], Path]) -> None:
    model = to_proto(read_graph(legacy_export(name), {}))
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    assert len(_resolved_shapes(inferred)) < sum(len(n.output) for n in model.graph.node)  # inference alone fails
    resolved = _resolved_shapes(resolve_shapes(model))
    assert resolved == {**resolved, **_observed_shapes(model)}


@pytest.mark.parametrize("name", IN_GRAPH_SHAPES)
def test_exported_models_rewritten_on_the_command_line_give_the_original_outputs(
        name: str, legacy_export: Callable[[str], Path], tmp_path: Path) -> None:
    """The rewritten model also states every tensor's shape, for `onnx-remat run` and the memory measurement."""
    source, out = legacy_export(name), tmp_path / "out.onnx"
    assert main([str(source), str(out), "--budget", "60%", "--time-limit", "5", "-q"]) == 0
    rewritten = onnx.load(out)
    assert set(_resolved_shapes(rewritten)) >= {o for n in rewritten.graph.node for o in n.output}
    feeds = random_feeds(rewritten)
    for got, want in zip(run(out, feeds), run(source, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class _PositiveEntries(torch.nn.Module):
    """x[x > 0]: how many entries there are depends on the input's values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x[x > 0] * 2)


def test_an_exported_value_dependent_shape_is_refused_naming_the_node(tmp_path: Path, capsys) -> None:
    path = tmp_path / "masked.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_PositiveEntries(), (torch.randn(2, 8),), str(path), dynamo=False, opset_version=17)
    assert main([str(path), str(tmp_path / "out.onnx"), "--budget", "60%"]) == 3
    error = capsys.readouterr().err.strip()
    assert "NonZero node '/NonZero'" in error and "depends on the input values" in error
    assert len(error.splitlines()) == 1
