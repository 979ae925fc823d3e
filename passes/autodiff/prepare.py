"""Ready a forward model for training: validate, name nodes, switch BatchNorm/Dropout/MaxPool to training form."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper, numpy_helper, version_converter

from onnx_remat.errors import ModelError
from onnx_remat.passes.autodiff.graph_info import GraphInfo
from onnx_remat.passes.manager import run_passes
from onnx_remat.passes.shapes import ResolveShapes

MIN_OPSET = 14
"""The oldest default-domain opset the training graph is written in (BatchNormalization's training_mode attribute
arrives at 14); an older model is converted up to it, a newer one is kept at its own opset."""
TRAINING_DOMAINS = frozenset({"ai.onnx.preview.training"})
TRAINING_OPS = frozenset({
    "InPlaceAccumulator", "ZeroGradient", "BatchNormInternal", "SoftmaxCrossEntropyLossInternal",
    "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss", "YieldOp", "SGDOptimizer", "AdamOptimizer",
    "AdamWOptimizer", "PassThrough", "ConcatTraining",
})


def prepared_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy at the model's opset (at least 14) with every node uniquely named; ModelError if it already is a
    training model."""
    model = _at_least_min_opset(model)
    _reject_training(model)
    taken = {n.name for n in model.graph.node if n.name}
    seen: set[str] = set()
    for k, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            name = f"{node.op_type}_{k}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)
        seen.add(node.name)
    return model


def _at_least_min_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """Copy the model, converting it up to MIN_OPSET if it is older; never down."""
    version = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=MIN_OPSET)
    if version >= MIN_OPSET:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy
    try:
        return version_converter.convert_version(model, MIN_OPSET)
    except Exception as exc:  # the converter raises several types
        raise ModelError(f"cannot convert the model from opset {version} up to {MIN_OPSET}: {exc}") from None


def ir_version_for(model: onnx.ModelProto) -> int:
    """The model's IR version, raised to the least its opsets need."""
    return max(model.ir_version, helper.find_min_ir_version_for(model.opset_import, ignore_unknown=True))


def _reject_training(model: onnx.ModelProto) -> None:
    """Refuse models with gradient outputs or training operators."""
    grads = [o.name for o in model.graph.output if o.name.startswith("grad.")]
    ops = sorted({f"{n.op_type} ({n.name or 'unnamed'})" for n in model.graph.node
                  if n.domain in TRAINING_DOMAINS or n.op_type in TRAINING_OPS
                  or (n.domain == "com.microsoft" and "Grad" in n.op_type)})
    if grads or ops:
        found = ", ".join([*grads, *ops])
        raise ModelError(f"the model already contains training parts ({found}): give the forward-only model")


def make_trainable(model: onnx.ModelProto) -> list[str]:
    """Put BatchNorm and Dropout in training mode and give MaxPool its Indices; return running-stat outputs."""
    stats: list[str] = []
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.domain in ("", "ai.onnx") and node.op_type == "BatchNormalization":
            nodes += _fresh_running_stats(node)
            stats += _train_batch_norm(node)
        elif node.domain in ("", "ai.onnx") and node.op_type == "Dropout":
            _train_dropout(model.graph, node)
        elif node.domain in ("", "ai.onnx") and node.op_type == "MaxPool":
            _fill_outputs(node, [".indices"])
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return stats


def _fresh_running_stats(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """Feed the BatchNorm copies of its running mean and variance (single-input Sum nodes), returned to be put
    before it. onnxruntime 1.32 (graph optimizations off, as onnx_remat runs it) updates the statistics in place
    into the initializers when their outputs are not graph outputs themselves, so a second run of one session
    starts from the first run's statistics; a copy takes the write instead."""
    copies = []
    for index, suffix in ((3, ".running_mean_in"), (4, ".running_var_in")):
        fresh = f"{node.name}{suffix}"
        copies.append(helper.make_node("Sum", [node.input[index]], [fresh], name=fresh))
        node.input[index] = fresh
    return copies


def _fill_outputs(node: onnx.NodeProto, suffixes: list[str]) -> list[str]:
    """Name the node's optional outputs 1.. (`<node><suffix>`) where absent; return their names."""
    outputs = list(node.output) + [""] * len(suffixes)
    for k, suffix in enumerate(suffixes, start=1):
        outputs[k] = outputs[k] or f"{node.name}{suffix}"
    node.output[:] = outputs[: len(suffixes) + 1]
    return outputs[1 : len(suffixes) + 1]


def _train_batch_norm(node: onnx.NodeProto) -> list[str]:
    """Set training_mode=1 and expose the updated running mean and variance."""
    kept = [a for a in node.attribute if a.name != "training_mode"]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute("training_mode", 1)])
    return _fill_outputs(node, [".running_mean_out", ".running_var_out"])


def _train_dropout(graph: onnx.GraphProto, node: onnx.NodeProto) -> None:
    """Feed training_mode=true and expose the mask the gradient needs."""
    flag = f"{node.name}.training_mode"
    graph.initializer.append(numpy_helper.from_array(np.array(True), flag))
    inputs = list(node.input) + ["", ""]
    node.input[:] = [inputs[0], inputs[1], flag]
    _fill_outputs(node, [".mask"])


def infer(model: onnx.ModelProto) -> GraphInfo:
    """Every tensor's shape and type, resolved on the model read into onnx-ir (passes/shapes.py)."""
    return GraphInfo(run_passes(ir.serde.deserialize_model(model), [ResolveShapes()]))
