"""A recomputed Split read in part becomes Slices whose constants are shared by value (passes/partial_split.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import onnx_remat
from onnx_remat.passes.execute import random_feeds, run

WIDTH, ROWS, LAYERS = 64, 256, 6
BUDGET = "800000"
"""Bytes: 0.29 of keeping all (2,786,710), 1.1 times the minimum (726,960): Splits are recomputed for a half."""


class Gated(torch.nn.Module):
    """Mamba's gate in small: each layer's projection split in two, one half feeding the next layer, the other
    gating the output at the end, so that at the minimum budget a Split is recomputed for one of its halves."""

    def __init__(self) -> None:
        super().__init__()
        self.projections = torch.nn.ModuleList(torch.nn.Linear(WIDTH, 2 * WIDTH) for _ in range(LAYERS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gates = []
        for projection in self.projections:
            a, b = projection(x).split([WIDTH, WIDTH], dim=-1)
            x = x + torch.tanh(a)
            gates.append(b)
        for b in reversed(gates):
            x = x * torch.sigmoid(b)
        return x


@pytest.mark.slow  # the dynamo export and the solve: 15 s on a quiet machine, a minute at load 15
def test_recomputed_splits_share_their_slices_constants(tmp_path):
    """Mamba's inference at its minimum (dynamo export, batch 32) sliced 681 one-element initializers, one per starts,
    ends and axes of each Slice: onnxruntime holds each for the whole run (0.23 MiB the problem never saw), and the
    rewrite measured 7.26 MiB against a 7.07 MiB budget. Here each value (0, 64, 128 and axis 1) is one initializer,
    where every recomputed Slice added three before."""
    torch.manual_seed(0)
    path = tmp_path / "gated.onnx"
    torch.onnx.export(Gated(), (torch.randn(ROWS, WIDTH),), str(path), dynamo=True, external_data=False,
                      input_names=["x"], output_names=["y"])
    model = onnx.load(str(path))
    assert [node.op_type for node in model.graph.node].count("Split") == LAYERS
    result = onnx_remat.remat(model, BUDGET, mode="infer", time_limit=10, cost_model="analytic")
    assert any(node.op_type == "Slice" and "__remat" in node.name for node in result.model.graph.node)
    original = {tensor.name for tensor in model.graph.initializer}
    added = [numpy_helper.to_array(tensor).tolist() for tensor in result.model.graph.initializer
             if tensor.name not in original]
    assert len(added) == len({value for (value,) in added})
    assert {value for (value,) in added} <= {0, 1, WIDTH, 2 * WIDTH}
    feeds = random_feeds(model, seed=0)
    np.testing.assert_array_equal(run(result.model, feeds)[0], run(model, feeds)[0])
