"""RoiAlign and MaxRoiPool gradients w.r.t. the feature map on hand-built one-node models (neither exporter writes
them here: torchvision's compiled ops do not load): finite differences in onnx's reference runtime (RoiAlign; it has
no MaxRoiPool), and autograd through torchvision's pure-PyTorch roi_align and a loop-per-bin max pool in
onnxruntime. The regions get no gradient, as in torchvision; RoiAlign's may be fed at run time."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import step_as_proto
from onnx import helper, numpy_helper
from test_autodiff_rules import (
    TORCH_TOLERANCE,
    Case,
    case_model,
    check,
    check_finite_differences,
    check_runtimes,
    rand,
    rel_err,
    run_ort,
    torch_grads,
)

from onnx_remat.core.errors import ModelError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from real_model_zoo import import_torchvision  # noqa: E402

BOXES = np.array([[0.5, 1.0, 6.5, 5.0], [2.0, 0.0, 8.9, 7.5], [-0.4, 3.0, 3.0, 8.4], [4.0, 4.0, 4.0, 4.0]])
"""x1, y1, x2, y2 on a (8, 9) map: inside, to the edge, partly outside (samples in [-1, 0), read at 0), and a
single point. torchvision's pure-PyTorch roi_align lacks its kernels' (and onnxruntime's) zero for samples beyond
[-1, size]: test_samples_off_the_map checks those by finite differences only."""
IMAGES = np.array([1, 0, 1, 0], dtype=np.int64)


def torch_roi_align(scale: float, out: tuple[int, int], ratio: int, aligned: bool):
    import_torchvision()
    from torchvision.ops.roi_align import _roi_align

    roi_align = _roi_align.__wrapped__  # not torch.compile'd (50 s a call)

    def fn(x: torch.Tensor, boxes: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        rois = torch.cat([images[:, None].to(x.dtype), boxes.detach()], 1)
        return roi_align(x, rois, scale, out[0], out[1], ratio, aligned)
    return fn


def roi_align_case(out: tuple[int, int], ratio: int, scale: float = 1.0, half_pixel: bool = True,
                   opset: int = 16) -> Case:
    attrs = {"output_height": out[0], "output_width": out[1], "sampling_ratio": ratio, "spatial_scale": scale}
    if opset >= 16:
        attrs["coordinate_transformation_mode"] = "half_pixel" if half_pixel else "output_half_pixel"
    return Case("RoiAlign", [rand(2, 3, 8, 9), BOXES / scale, IMAGES], torch_roi_align(scale, out, ratio, half_pixel),
                attrs, opset=opset)


ROI_ALIGNS = [
    roi_align_case((2, 3), 2),
    roi_align_case((3, 3), 0),  # adaptive sampling: ceil(extent / bins) samples per bin
    roi_align_case((2, 2), 1, scale=0.5),
    roi_align_case((3, 2), 0, half_pixel=False),
    roi_align_case((2, 3), 2, half_pixel=False, opset=10),  # opset 10 has only output_half_pixel
]


@pytest.mark.parametrize("case", ROI_ALIGNS, ids=repr)
def test_roi_align(case: Case) -> None:
    check(case)


def test_samples_off_the_map() -> None:
    """Samples beyond [-1, size] read zero: a region reaching 3 past the map's bottom and left edges."""
    boxes = np.array([[-4.0, 3.0, 3.0, 11.0], [1.0, 1.0, 5.0, 5.0]])
    check_finite_differences(Case("RoiAlign", [rand(2, 3, 8, 9), boxes, IMAGES[:2]], None,
                                  {"output_height": 3, "output_width": 2, "sampling_ratio": 2}, opset=16))


def torch_max_roi_pool(scale: float, out: tuple[int, int]):
    """torchvision's roi_pool (its CPU kernel's bins) written per bin: corners rounded half away from zero."""
    def fn(x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        height, width = x.shape[2:]
        pooled = []
        for image, *corners in rois.detach().tolist():
            x1, y1, x2, y2 = (int(math.copysign(math.floor(abs(v) * scale + 0.5), v)) for v in corners)
            bin_h, bin_w = max(y2 - y1 + 1, 1) / out[0], max(x2 - x1 + 1, 1) / out[1]
            cells = []
            for ph in range(out[0]):
                top, bottom = (min(max(v + y1, 0), height)
                               for v in (math.floor(ph * bin_h), math.ceil((ph + 1) * bin_h)))
                for pw in range(out[1]):
                    left, right = (min(max(v + x1, 0), width)
                                   for v in (math.floor(pw * bin_w), math.ceil((pw + 1) * bin_w)))
                    region = x[int(image), :, top:bottom, left:right].flatten(1)
                    cells.append(region.max(1).values if region.shape[1] else x.new_zeros(x.shape[1]))
            pooled.append(torch.stack(cells, 1).reshape(-1, *out))
        return torch.stack(pooled)
    return fn


ROIS = np.concatenate([IMAGES[:, None], BOXES], 1)

MAX_ROI_POOLS = [  # onnx's reference runtime has no MaxRoiPool: no finite differences
    Case("MaxRoiPool", [rand(2, 3, 8, 9), ROIS], torch_max_roi_pool(1.0, (2, 3)), {"pooled_shape": [2, 3]},
         finite_differences=False),
    Case("MaxRoiPool", [rand(2, 3, 8, 9), ROIS * [1, 2, 2, 2, 2]], torch_max_roi_pool(0.5, (3, 3)),
         {"pooled_shape": [3, 3], "spatial_scale": 0.5}, finite_differences=False),
    # a region off the map: its bins are empty, their outputs 0
    Case("MaxRoiPool", [rand(1, 2, 5, 5), np.array([[0.0, 1, 1, 3, 4], [0, 7, 7, 9, 9]])],
         torch_max_roi_pool(1.0, (2, 2)), {"pooled_shape": [2, 2]}, finite_differences=False, openvino=False),
]


@pytest.mark.parametrize("case", MAX_ROI_POOLS, ids=repr)
def test_max_roi_pool(case: Case) -> None:
    """The oracle's forward equals onnxruntime's (the same bins), then its gradient does."""
    model = case_model(case, np.float32)
    probe = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "probe0"))
    expected = (case.torch_fn(*(torch.tensor(a) for a in case.inputs)) * torch.tensor(probe)).sum().item()
    assert abs(float(run_ort(model)["output"]) - expected) < 1e-5 * max(1.0, abs(expected))
    check_runtimes(case)


def with_inputs(model: onnx.ModelProto, names: list[str]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model with those initializers made graph inputs, and their values as feeds."""
    feeds = {}
    for name in names:
        init = next(i for i in model.graph.initializer if i.name == name)
        feeds[name] = numpy_helper.to_array(init)
        model.graph.initializer.remove(init)
        model.graph.input.append(helper.make_tensor_value_info(name, init.data_type, list(init.dims)))
    return model, feeds


@pytest.mark.parametrize("fed", [["in1"], ["in1", "in2"]])
@pytest.mark.parametrize("case", [roi_align_case((2, 3), 2), roi_align_case((3, 2), 1, half_pixel=False),
                                  roi_align_case((2, 2), 2, scale=0.5)], ids=repr)
def test_regions_from_the_inputs(case: Case, fed: list[str]) -> None:
    """Regions (and their images) fed at run time: the weights computed in the graph give torch's gradient."""
    model, feeds = with_inputs(case_model(case, np.float32), fed)
    training = step_as_proto(model, loss="sum", freeze=["probe0"])
    got = run_ort(training.model, feeds)["grad.in0"]
    assert rel_err(got, torch_grads(case)["grad.in0"]) < TORCH_TOLERANCE


def test_adaptive_sampling_of_fed_regions_is_refused() -> None:
    model, _ = with_inputs(case_model(roi_align_case((2, 3), 0), np.float32), ["in1"])
    with pytest.raises(ModelError, match="RoiAlign 'op': regions from the graph's inputs with adaptive sampling"):
        step_as_proto(model, loss="sum", freeze=["probe0"])
