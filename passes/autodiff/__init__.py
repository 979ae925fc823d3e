"""Training-graph builder: reverse-mode autodiff writing the backward pass in standard ONNX at the model's opset."""

from onnx_remat.passes.autodiff.builder import BuildTrainingStep, TrainingGraph, build_training_graph
from onnx_remat.passes.autodiff.loss import LABEL, LOSS, LOSSES
from onnx_remat.passes.autodiff.rules import RULES

__all__ = ["LABEL", "LOSS", "LOSSES", "RULES", "BuildTrainingStep", "TrainingGraph", "build_training_graph"]
