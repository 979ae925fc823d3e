"""Training-graph builder: reverse-mode autodiff emitting the backward pass in standard opset-17 ONNX ops."""

from onnx_remat.passes.autodiff.builder import TrainingGraph, build_training_graph
from onnx_remat.passes.autodiff.loss import LABEL, LOSS, LOSSES
from onnx_remat.passes.autodiff.rules import RULES

__all__ = ["LABEL", "LOSS", "LOSSES", "RULES", "TrainingGraph", "build_training_graph"]
