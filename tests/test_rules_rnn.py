"""RNN nodes (tanh and relu, one and two directions, two layers) as PyTorch's legacy exporter writes them (the dynamo
exporter writes the steps out itself): unrolled before differentiation, the training step's gradients match
autograd and survive a rewrite (tools/real_models.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import step_as_proto
from onnx import TensorProto, helper, numpy_helper

from onnx_remat.core.errors import ModelError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from real_models import check  # noqa: E402

SOLVE_SECONDS = 2.0
"""Each solve stops by then with its best schedule, which is checked: nothing here waits for a proof."""


@pytest.mark.parametrize(("name", "exporter"), [("op_rnn_tanh", "legacy"), ("op_rnn_relu", "legacy")])
def test_rnn_trains(name: str, exporter: str, tmp_path: Path) -> None:
    outcome = check(name, exporter, tmp_path, time_limit=SOLVE_SECONDS)
    assert not outcome.problems()
    assert outcome.gradients_compared == outcome.gradients_written > 0


def test_rnn_with_another_activation_is_refused_naming_the_node() -> None:
    weights = [numpy_helper.from_array(np.full(shape, 0.1, np.float32), name)
               for name, shape in (("x", (3, 2, 4)), ("w", (1, 5, 4)), ("r", (1, 5, 5)))]
    node = helper.make_node("RNN", ["x", "w", "r"], ["y"], name="rnn", hidden_size=5, activations=["Sigmoid"])
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 1, 2, 5])
    graph = helper.make_graph([node], "g", [], [output], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    with pytest.raises(ModelError, match=r"RNN 'rnn' uses activations \['Sigmoid'\]"):
        step_as_proto(model, loss="sum")
