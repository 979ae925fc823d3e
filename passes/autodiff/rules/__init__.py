"""Every gradient rule, registered in one place: op type -> Rule (function, differentiable inputs)."""

from __future__ import annotations

from onnx_remat.passes.autodiff.rules import activation, einsum, gather, linear, norm, pool, resize, shape
from onnx_remat.passes.autodiff.rules import elementwise as ew
from onnx_remat.passes.autodiff.rules.base import GradFn, Rule

RULES: dict[str, Rule] = {
    # arithmetic with broadcasting
    "Add": Rule(ew.add, (0, 1)),
    "Sub": Rule(ew.sub, (0, 1)),
    "Sum": Rule(ew.sum_, None),
    "Mul": Rule(ew.mul, (0, 1)),
    "Div": Rule(ew.div, (0, 1)),
    "Neg": Rule(ew.neg),
    "Abs": Rule(ew.abs_),
    "Max": Rule(ew.max_, None),
    "Min": Rule(ew.min_, None),
    "Where": Rule(ew.where, (1, 2)),
    "Expand": Rule(ew.expand),
    # activations and unary math
    "Relu": Rule(ew.relu),
    "LeakyRelu": Rule(ew.leaky_relu),
    "Sigmoid": Rule(ew.sigmoid),
    "Tanh": Rule(ew.tanh),
    "Clip": Rule(ew.clip),
    "Erf": Rule(ew.erf),
    "Sin": Rule(ew.sin),
    "Cos": Rule(ew.cos),
    "Exp": Rule(ew.exp),
    "Log": Rule(ew.log),
    "Sqrt": Rule(ew.sqrt),
    "Reciprocal": Rule(ew.reciprocal),
    "Pow": Rule(ew.pow_),
    "Identity": Rule(ew.identity),
    "Cast": Rule(ew.cast),
    "CastLike": Rule(ew.cast),
    "Dropout": Rule(ew.dropout),
    "Gelu": Rule(activation.gelu),
    "HardSigmoid": Rule(activation.hard_sigmoid),
    "HardSwish": Rule(activation.hard_swish),
    "Softplus": Rule(activation.softplus),
    "Mish": Rule(activation.mish),
    "Elu": Rule(activation.elu),
    "PRelu": Rule(activation.prelu, (0, 1)),
    # ops with weights
    "Gemm": Rule(linear.gemm, (0, 1, 2)),
    "MatMul": Rule(linear.matmul, (0, 1)),
    "Einsum": Rule(einsum.einsum, None),
    "Conv": Rule(linear.conv, (0, 1, 2)),
    "ConvTranspose": Rule(linear.conv_transpose, (0, 1, 2)),
    # normalizations and softmaxes
    "BatchNormalization": Rule(norm.batch_norm, (0, 1, 2)),
    "InstanceNormalization": Rule(norm.instance_norm, (0, 1, 2)),
    "LayerNormalization": Rule(norm.layer_norm, (0, 1, 2)),
    "Softmax": Rule(norm.softmax),
    "LogSoftmax": Rule(norm.log_softmax),
    # pooling and reductions
    "MaxPool": Rule(pool.max_pool),
    "AveragePool": Rule(pool.average_pool),
    "GlobalAveragePool": Rule(pool.global_average_pool),
    "ReduceMean": Rule(pool.reduce_mean),
    "ReduceSum": Rule(pool.reduce_sum),
    "ReduceMax": Rule(pool.reduce_max),
    "CumSum": Rule(pool.cum_sum),
    # data movement
    "Reshape": Rule(shape.reshape_back),
    "Flatten": Rule(shape.reshape_back),
    "Trilu": Rule(shape.trilu),
    "Squeeze": Rule(shape.reshape_back),
    "Unsqueeze": Rule(shape.reshape_back),
    "Transpose": Rule(shape.transpose),
    "Concat": Rule(shape.concat, None),
    "Split": Rule(shape.split, outputs=None),
    "Slice": Rule(shape.slice_),
    "Pad": Rule(shape.pad),
    "DepthToSpace": Rule(shape.depth_to_space),
    "SpaceToDepth": Rule(shape.space_to_depth),
    "Resize": Rule(resize.resize),
    # indexing
    "Gather": Rule(gather.gather),
    "GatherElements": Rule(gather.gather_elements),
    "GatherND": Rule(gather.gather_nd),
    "ScatterND": Rule(gather.scatter_nd, (0, 2)),
    "TopK": Rule(gather.top_k),
}

__all__ = ["RULES", "GradFn", "Rule"]
