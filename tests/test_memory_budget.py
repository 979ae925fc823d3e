"""Measured memory in onnxruntime: a rewritten model really holds less, and what was predicted."""

from __future__ import annotations

import onnx
import pytest

import onnx_remat
from onnx_remat.models import build
from onnx_remat.passes.measure import measure_activation_peak


@pytest.mark.slow
def test_recomputation_lowers_measured_peak_as_predicted(tmp_path):
    original = build("wavenet", length=8192)
    original_path, rewritten_path = tmp_path / "wavenet.onnx", tmp_path / "wavenet.remat.onnx"
    onnx.save(original, original_path)
    result = onnx_remat.remat(original, "15%", time_limit=30)
    result.save(rewritten_path)
    report = result.report
    keep_all_order_peak = report.baselines["keep-all"].peak_bytes
    assert report.budget_bytes < keep_all_order_peak, "the budget must force recomputation"
    predicted = report.predicted_peak_bytes - report.resident_bytes
    measured = measure_activation_peak(rewritten_path)
    measured_original = measure_activation_peak(original_path)
    assert measured < measured_original
    assert abs(measured - predicted) <= 0.10 * predicted, (measured, predicted)
