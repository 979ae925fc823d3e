"""The model builders give valid, fully shaped ONNX that onnxruntime and OpenVINO agree on; the exported
fixtures match the PyTorch modules they came from."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import openvino as ov
import pytest

from onnx_remat.models import FIXTURES, MODELS, build, build_mobilenet_v2, build_resnet18, build_resnet34

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

FIXTURE_NAMES = ("resnet18_small", "unet_small", "transformer_small")


def _run_ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """Run a single-input model in onnxruntime on CPU."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x})[0]


def _input_shape(model: onnx.ModelProto) -> list[int]:
    """The concrete shape of the graph input `input`."""
    return [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]


def _random_input(model: onnx.ModelProto, batch: int | None = None) -> np.ndarray:
    """A seeded standard-normal input for the model, optionally with another batch size."""
    shape = _input_shape(model)
    if batch is not None:
        shape[0] = batch
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def _parameter_count(model: onnx.ModelProto) -> int:
    """Trainable parameters as PyTorch counts them: no BatchNorm statistics and no op constants."""
    return sum(
        int(np.prod(t.dims))
        for t in model.graph.initializer
        if not t.name.endswith((".mean", ".var")) and not t.name.startswith("relu6.")
    )


@pytest.fixture(scope="module", params=sorted(MODELS))
def built(request: pytest.FixtureRequest) -> tuple[str, onnx.ModelProto]:
    """Each registered model at its default (small) size, built once per module."""
    return request.param, build(request.param)


def test_builder_is_valid_opset17_ir10(built: tuple[str, onnx.ModelProto]) -> None:
    name, model = built
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 10
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert [i.name for i in model.graph.input] == ["input"]
    assert [o.name for o in model.graph.output] == ["output"]
    names = [n.name for n in model.graph.node]
    assert all(names) and len(set(names)) == len(names), name


def test_shape_inference_gives_every_tensor_a_concrete_shape(built: tuple[str, onnx.ModelProto]) -> None:
    _, model = built
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    shapes = {v.name: v.type.tensor_type.shape for v in [*inferred.graph.value_info, *inferred.graph.output]}
    for node in model.graph.node:
        for out in node.output:
            assert out in shapes, f"{node.name}: no shape for {out}"
            assert all(d.dim_value > 0 for d in shapes[out].dim), f"{node.name}: {shapes[out]}"


def test_onnxruntime_and_openvino_agree(built: tuple[str, onnx.ModelProto], tmp_path: Path) -> None:
    name, model = built
    x = _random_input(model)
    expected = _run_ort(model, x)
    out_shape = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    assert list(expected.shape) == out_shape
    assert np.isfinite(expected).all()
    assert 1e-2 < np.abs(expected).mean() < 1e2, f"{name}: activations are not O(1)"
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    actual = compiled(x)[compiled.output(0)]
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_symbolic_batch(name: str) -> None:
    model = build(name, batch=None)
    onnx.checker.check_model(model, full_check=True)
    for value in (model.graph.input[0], model.graph.output[0]):
        assert value.type.tensor_type.shape.dim[0].dim_param == "batch"
    x = np.random.default_rng(0).standard_normal([3, *_input_shape(model)[1:]]).astype(np.float32)
    out = _run_ort(model, x)
    assert out.shape[0] == 3
    np.testing.assert_allclose(out[1:2], _run_ort(model, x[1:2]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("builder", "parameters"),
    [(build_resnet18, 11_689_512), (build_resnet34, 21_797_672), (build_mobilenet_v2, 3_504_872)],
)
def test_paper_sizes_match_torchvision_parameter_counts(
    builder: Callable[..., onnx.ModelProto], parameters: int
) -> None:
    kwargs = {"width_mult": 1.0} if builder is build_mobilenet_v2 else {"width": 64}
    model = builder(resolution=224, num_classes=1000, **kwargs)
    assert _parameter_count(model) == parameters
    out = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.output[0]
    assert [d.dim_value for d in out.type.tensor_type.shape.dim] == [1, 1000]


def test_build_rejects_unknown_names_and_bad_sizes() -> None:
    with pytest.raises(KeyError, match="known: vgg16"):
        build("alexnet")
    with pytest.raises(ValueError, match="divisible"):
        build("vgg16", resolution=40)
    with pytest.raises(ValueError, match="divisible"):
        build("unet", resolution=36, depth=3)
    with pytest.raises(ValueError, match="divisible"):
        build("transformer_encoder", d_model=30, heads=4)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_matches_its_torch_module(name: str) -> None:
    torch = pytest.importorskip("torch")
    from fixture_modules import make

    model = onnx.load(FIXTURES / f"{name}.onnx")
    onnx.checker.check_model(model, full_check=True)
    module, example = make(name)
    with torch.no_grad():
        expected = module(example).numpy()
    actual = _run_ort(model, example.numpy())
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(expected).max()))
