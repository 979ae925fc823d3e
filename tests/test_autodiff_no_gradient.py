"""Ops whose output passes no gradient to their inputs (rules.base.NO_GRADIENT): piecewise-constant ones, random
draws and shape readers do not block training, and their inputs get no gradient from them, as in torch."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import step_as_proto
from onnx import TensorProto, helper, numpy_helper
from test_autodiff_rules import rand, run_ort

from onnx_remat.passes.autodiff import RULES
from onnx_remat.passes.autodiff.rules.base import NO_GRADIENT

W = rand(3, 4) * 3


def hardmax(x: np.ndarray) -> np.ndarray:
    return np.eye(x.shape[1])[x.argmax(1)]


# op -> (the nodes computing `drawn` from the parameter `w`, the value numpy expects for it, or None for a draw)
DRAWS: dict[str, tuple[list[onnx.NodeProto], np.ndarray | None]] = {
    "Sign": ([helper.make_node("Sign", ["w"], ["drawn"])], np.sign(W)),
    "Round": ([helper.make_node("Round", ["w"], ["drawn"])], np.round(W)),
    "Floor": ([helper.make_node("Floor", ["w"], ["drawn"])], np.floor(W)),
    "Ceil": ([helper.make_node("Ceil", ["w"], ["drawn"])], np.ceil(W)),
    "Hardmax": ([helper.make_node("Hardmax", ["w"], ["drawn"], axis=1)], hardmax(W)),
    "EyeLike": ([helper.make_node("EyeLike", ["w"], ["drawn"])], np.eye(3, 4)),
    "Bernoulli": ([helper.make_node("Sigmoid", ["w"], ["p"]), helper.make_node("Bernoulli", ["p"], ["drawn"])], None),
    "RandomNormalLike": ([helper.make_node("RandomNormalLike", ["w"], ["drawn"])], None),
    "RandomUniformLike": ([helper.make_node("RandomUniformLike", ["w"], ["drawn"])], None),
    # Shape and Size read only the shape: (3 + 4) and 12 times w.
    "Shape": ([helper.make_node("Shape", ["w"], ["dims"]), helper.make_node("Cast", ["dims"], ["fdims"], to=1),
               helper.make_node("ReduceSum", ["fdims"], ["drawn"], keepdims=0)], np.array(7.0)),
    "Size": ([helper.make_node("Size", ["w"], ["count"]), helper.make_node("Cast", ["count"], ["drawn"], to=1)],
             np.array(12.0)),
}


def model_of(nodes: list[onnx.NodeProto], extra: list[onnx.NodeProto], output: str, inits: dict[str, np.ndarray],
             shown: list[tuple[str, int]]) -> onnx.ModelProto:
    """nodes + extra on float32 initializers; graph outputs `output` and the tensors `shown` (name, element type)."""
    outputs = [onnx.ValueInfoProto(name=output)] + [helper.make_tensor_value_info(n, t, None) for n, t in shown]
    graph = helper.make_graph([*nodes, *extra], "g", [], outputs,
                              [numpy_helper.from_array(a.astype(np.float32), n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize("op", sorted(DRAWS))
def test_output_passes_no_gradient(op: str) -> None:
    """w * op(w): only the first factor carries dy, so grad w is op(w) as the same run computed it."""
    nodes, expected = DRAWS[op]
    model = model_of(nodes, [helper.make_node("Mul", ["w", "drawn"], ["output"])], "output", {"w": W},
                     [("drawn", TensorProto.FLOAT)])
    training = step_as_proto(model, loss="sum")
    assert training.parameters == ("w",)
    got = run_ort(training.model)
    if expected is not None:
        np.testing.assert_allclose(got["drawn"], expected, rtol=1e-6)
    np.testing.assert_allclose(got["grad.w"], np.broadcast_to(got["drawn"], W.shape), rtol=1e-6)


def test_multinomial_draws_pass_no_gradient() -> None:
    """Drawn class indices pick logits (GatherElements): each logit's gradient counts its draws, none comes through
    the draw itself."""
    nodes = [helper.make_node("Multinomial", ["w"], ["drawn"], sample_size=6, dtype=TensorProto.INT64),
             helper.make_node("GatherElements", ["w", "drawn"], ["output"], axis=1)]
    model = model_of(nodes, [], "output", {"w": rand(1, 5)}, [("drawn", TensorProto.INT64)])
    got = run_ort(step_as_proto(model, loss="sum").model)
    np.testing.assert_array_equal(got["grad.w"], np.bincount(got["drawn"][0], minlength=5)[None, :])


def test_a_parameter_only_behind_a_draw_is_not_trained() -> None:
    """v reaches the loss only through Bernoulli's probabilities: the step trains w alone, with no integer-path
    refusal for v."""
    nodes = [helper.make_node("Sigmoid", ["v"], ["p"]), helper.make_node("Bernoulli", ["p"], ["drawn"]),
             helper.make_node("Mul", ["w", "drawn"], ["output"])]
    model = model_of(nodes, [], "output", {"w": W, "v": rand(3, 4, seed=1)}, [])
    training = step_as_proto(model, loss="sum")
    assert training.parameters == ("w",)


def test_every_no_gradient_op_is_tested() -> None:
    assert {op for op, rule in RULES.items() if rule is NO_GRADIENT} == {*DRAWS, "Multinomial"}
