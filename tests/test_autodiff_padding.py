"""Pad's reflect, edge and wrap modes, and opset 18's axes input: finite differences and torch autograd (F.pad's
reflect, replicate and circular modes)."""

from __future__ import annotations

import pytest
import torch.nn.functional as F
from test_autodiff_rules import Case, check, ints, rand


def torch_pad(pads: list[int], mode: str):
    return lambda x, *constants: F.pad(x, pads, mode=mode)


PADS = [
    Case("Pad", [rand(2, 3, 5), ints(0, 0, 2, 0, 0, 1)], torch_pad([2, 1], "reflect"), {"mode": "reflect"}),
    Case("Pad", [rand(1, 2, 4, 5), ints(0, 0, 1, 2, 0, 0, 3, 1)], torch_pad([2, 1, 1, 3], "reflect"),
         {"mode": "reflect"}),
    Case("Pad", [rand(2, 3, 5), ints(0, 0, 4, 0, 0, 4)], torch_pad([4, 4], "reflect"), {"mode": "reflect"}),
    Case("Pad", [rand(1, 2, 4, 5), ints(0, 0, 1, 2, 0, 0, 3, 1)], torch_pad([2, 1, 1, 3], "replicate"),
         {"mode": "edge"}),
    Case("Pad", [rand(1, 2, 4, 5), ints(0, 0, 1, 2, 0, 0, 3, 1)], torch_pad([2, 1, 1, 3], "circular"),
         {"mode": "wrap"}, opset=19, openvino=False),
    # opset 18's axes: the pads of the last axis only
    Case("Pad", [rand(2, 3, 5), ints(2, 1), None, ints(-1)], torch_pad([2, 1], "reflect"), {"mode": "reflect"},
         opset=18),
    Case("Pad", [rand(2, 3, 5), ints(1, 2, 0, 1), None, ints(1, 2)], torch_pad([2, 1, 1, 0], "constant"), opset=18),
]


@pytest.mark.parametrize("case", PADS, ids=repr)
def test_pad(case: Case) -> None:
    check(case)
