"""DFT (opset 17 and 20) and STFT gradients on one-node models: finite differences (float64, onnx's reference
runtime), and torch.fft / torch.stft autograd in onnxruntime (OpenVINO has no DFT gradient form it runs alike:
only onnxruntime)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import step_as_proto
from onnx import TensorProto, helper, numpy_helper
from test_autodiff_rules import TORCH_TOLERANCE, Case, check, rand, rel_err, run_ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from real_models import check as check_model  # noqa: E402

SOLVE_SECONDS = 2.0
"""Each solve stops by then with its best schedule, which is checked: nothing here waits for a proof."""


def scalar(value: int) -> np.ndarray:
    return np.array(value, dtype=np.int64)


def complex_of(x: torch.Tensor) -> torch.Tensor:
    """ONNX's (..., 1) real or (..., 2) complex layout as a torch tensor."""
    return x[..., 0] if x.shape[-1] == 1 else torch.complex(x[..., 0], x[..., 1])


def torch_dft(axis: int, n: int | None = None, inverse: bool = False, onesided: bool = False,
              ) -> Callable[..., torch.Tensor]:
    """torch.fft's transform that DFT computes along `axis` (counted with the last, complex axis)."""
    def fn(x: torch.Tensor, *constants: torch.Tensor) -> torch.Tensor:
        dim = axis % x.dim()
        z = complex_of(x)
        if inverse and onesided:
            return torch.fft.irfft(z, n=n, dim=dim).unsqueeze(-1)
        transform = torch.fft.ifft if inverse else torch.fft.rfft if onesided else torch.fft.fft
        return torch.view_as_real(transform(z, n=n, dim=dim))
    return fn


def dft_case(x: np.ndarray, axis: int, n: int | None = None, inverse: int = 0, onesided: int = 0,
             opset: int = 20) -> Case:
    """DFT at opset 20 (axis an input) or 17 (an attribute), with dft_length n when given."""
    flags = {"inverse": inverse, "onesided": onesided}
    length = None if n is None else scalar(n)
    fn = torch_dft(axis, n, bool(inverse), bool(onesided))
    if opset >= 20:
        return Case("DFT", [x, length, scalar(axis)], fn, flags, opset=opset, openvino=False)
    return Case("DFT", [x, length], fn, {**flags, "axis": axis}, opset=opset, openvino=False)


DFTS = [
    dft_case(rand(2, 8, 1), 1),  # torch.fft.fft of a real signal, as the dynamo exporter writes it
    dft_case(rand(2, 3, 8, 2), -2),  # complex
    dft_case(rand(2, 6, 3, 1), 1, n=8),  # padded
    dft_case(rand(2, 6, 3, 2), 1, n=4),  # cut
    dft_case(rand(2, 8, 1), 1, onesided=1),  # rfft
    dft_case(rand(2, 7, 1), 1, n=11, onesided=1),  # rfft, odd and padded
    dft_case(rand(3, 8, 2), 1, inverse=1),  # ifft
    dft_case(rand(3, 5, 2), -2, n=8, inverse=1, onesided=1),  # irfft, even
    dft_case(rand(3, 4, 2), 1, n=7, inverse=1, onesided=1),  # irfft, odd
    dft_case(rand(3, 5, 2), 1, inverse=1, onesided=1),  # irfft, default length 2 * (5 - 1)
    dft_case(rand(2, 8, 1), 1, opset=17),
    dft_case(rand(2, 5, 3, 2), 2, n=6, inverse=1, opset=17),
    dft_case(rand(3, 5, 2), 1, n=8, inverse=1, onesided=1, opset=17),
]


@pytest.mark.parametrize("case", DFTS, ids=repr)
def test_dft(case: Case) -> None:
    check(case)


def torch_stft(step: int, length: int, onesided: bool) -> Callable[..., torch.Tensor]:
    def fn(signal: torch.Tensor, frame_step: torch.Tensor, window: torch.Tensor | None = None,
           frame_length: torch.Tensor | None = None) -> torch.Tensor:
        spectrum = torch.stft(complex_of(signal), length, step, window=window, center=False, onesided=onesided,
                              return_complex=True)
        return torch.view_as_real(spectrum.transpose(1, 2))
    return fn


# onesided is explicit, as the dynamo exporter writes it: without it onnx's shape inference and reference runtime
# take 0, onnxruntime the schema's default 1.
STFTS = [  # the window an initializer: a constant, no gradient (as torch.hann_window's buffer)
    Case("STFT", [rand(2, 20, 1), scalar(3), np.hanning(6)], torch_stft(3, 6, True), {"onesided": 1},
         openvino=False),
    Case("STFT", [rand(2, 16, 1), scalar(4), None, scalar(8)], torch_stft(4, 8, True), {"onesided": 1},
         openvino=False),
    Case("STFT", [rand(1, 14, 2), scalar(2), np.hanning(5)], torch_stft(2, 5, False), {"onesided": 0},
         openvino=False),
]


@pytest.mark.parametrize("case", STFTS, ids=repr)
def test_stft(case: Case) -> None:
    """torch.stft's window has no gradient here: it is a constant both sides."""
    detached = Case(case.op, case.inputs, lambda s, *rest: case.torch_fn(s, *(
        r.detach() if r is not None and r.is_floating_point() else r for r in rest)), case.attrs,
        openvino=False)
    check(detached)


def test_stft_computed_window() -> None:
    """A window computed from a parameter (sigmoid(v)) gets the frames' gradient too, as in torch."""
    signal, v, probe = rand(2, 20, 1), rand(6, seed=3), rand(2, 5, 4, 2, seed=4)
    nodes = [helper.make_node("Sigmoid", ["v"], ["window"]),
             helper.make_node("STFT", ["signal", "step", "window"], ["spectrum"], name="op", onesided=1),
             helper.make_node("Mul", ["spectrum", "probe"], ["output"])]
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (("signal", signal), ("v", v),
                                                                             ("probe", probe))]
    inits.append(numpy_helper.from_array(scalar(3), "step"))
    output = helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 5, 4, 2])
    model = helper.make_model(helper.make_graph(nodes, "g", [], [output], inits),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(model)
    training = step_as_proto(model, loss="sum", freeze=["probe"])
    got = run_ort(training.model)
    tensors = {n: torch.tensor(a, requires_grad=True) for n, a in (("signal", signal), ("v", v))}
    spectrum = torch_stft(3, 6, True)(tensors["signal"], torch.tensor(3), torch.sigmoid(tensors["v"]))
    (spectrum * torch.tensor(probe)).sum().backward()
    for name, tensor in tensors.items():
        assert rel_err(got[f"grad.{name}"], tensor.grad.numpy()) < TORCH_TOLERANCE


@pytest.mark.parametrize("name", ["op_fftn", "op_stft", *(pytest.param(name, marks=pytest.mark.slow)
                                                          for name in ("op_fft", "op_rfft", "op_irfft"))])
def test_exported_transforms_train(name: str, tmp_path: Path) -> None:
    """torch.fft and torch.stft as the dynamo exporter writes them (FNet's fftn, a magnitude spectrogram; the legacy
    exporter writes neither): the training step matches autograd and survives a rewrite (tools/real_models.py)."""
    outcome = check_model(name, "dynamo", tmp_path, time_limit=SOLVE_SECONDS)
    assert not outcome.problems()
    assert outcome.gradients_compared == outcome.gradients_written > 0
