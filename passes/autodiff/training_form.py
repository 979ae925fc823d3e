"""Ready a forward model for training: validate, name nodes, switch BatchNorm/Dropout to training form."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx import helper, version_converter

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff.graph_info import GraphInfo
from onnx_remat.passes.manager import named, run_passes, to_proto
from onnx_remat.passes.shapes import ResolveShapes

MIN_OPSET = 16
"""The oldest default-domain opset the training graph is written in (BatchNormalization's training_mode attribute
arrives at 14, the reduction="add" of ScatterND and ScatterElements that the gradients of Gather, GatherElements,
GatherND and MaxPool accumulate with at 16); an older model is converted up to it, a newer one is kept at its own
opset."""
TRAINING_DOMAINS = frozenset({"ai.onnx.preview.training"})
TRAINING_OPS = frozenset({
    "InPlaceAccumulator", "ZeroGradient", "BatchNormInternal", "SoftmaxCrossEntropyLossInternal", "YieldOp",
    "SGDOptimizer", "AdamOptimizer", "AdamWOptimizer", "PassThrough", "ConcatTraining",
})


def training_form_copy(model: ir.Model) -> ir.Model:
    """A copy at the model's opset (at least MIN_OPSET) with every node uniquely named; ModelError if it already is a
    training model."""
    model = _at_least_min_opset(model)
    reject_training(model)
    taken = {n.name for n in model.graph if n.name}
    seen: set[str] = set()
    for k, node in enumerate(model.graph):
        if not node.name or node.name in seen:
            name = f"{node.op_type}_{k}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)
        seen.add(node.name)
    return model


def _opset(model: ir.Model) -> int:
    """The model's default-domain opset (MIN_OPSET if it states none)."""
    return max((v for d, v in model.opset_imports.items() if d in ("", "ai.onnx")), default=MIN_OPSET)


def _at_least_min_opset(model: ir.Model) -> ir.Model:
    """Copy the model, converting it up to MIN_OPSET if it is older (onnx's version converter, on a proto); never
    down."""
    version = _opset(model)
    if version >= MIN_OPSET:
        return model.clone()
    try:
        return ir.serde.deserialize_model(version_converter.convert_version(to_proto(model), MIN_OPSET))
    except Exception as exc:  # the converter raises several types
        raise ModelError(f"cannot convert the model from opset {version} up to {MIN_OPSET}: {exc}") from None


def ir_version_for(model: ir.Model) -> int:
    """The model's IR version, raised to the least its opsets need."""
    opsets = [helper.make_opsetid(domain, version) for domain, version in model.opset_imports.items()]
    return max(model.ir_version, helper.find_min_ir_version_for(opsets, ignore_unknown=True))


def reject_training(model: ir.Model) -> None:
    """Refuse models with gradient outputs or training operators."""
    grads = [named(o) for o in model.graph.outputs if named(o).startswith("grad.")]
    ops = sorted({f"{n.op_type} ({n.name or 'unnamed'})" for n in model.graph
                  if n.domain in TRAINING_DOMAINS or n.op_type in TRAINING_OPS
                  or (n.domain == "com.microsoft" and "Grad" in n.op_type)})
    if grads or ops:
        found = ", ".join([*grads, *ops])
        raise ModelError(f"the model already contains training parts ({found}): give the forward-only model")


def make_trainable(model: ir.Model) -> list[ir.Value]:
    """Put BatchNorm and Dropout in training mode; return running-stat outputs."""
    stats: list[ir.Value] = []
    graph = model.graph
    for node in list(graph):
        if node.domain in ("", "ai.onnx") and node.op_type == "BatchNormalization":
            _fresh_running_stats(graph, node)
            stats += _train_batch_norm(node)
        elif node.domain in ("", "ai.onnx") and node.op_type == "Dropout":
            _train_dropout(graph, node)
    return stats


def _fresh_running_stats(graph: ir.Graph, node: ir.Node) -> None:
    """Feed the BatchNorm copies of its running mean and variance (single-input Sum nodes put before it).
    onnxruntime 1.32 (graph optimizations off, as onnx_remat runs it) updates the statistics in place into the
    initializers when their outputs are not graph outputs themselves, so a second run of one session starts from
    the first run's statistics; a copy takes the write instead."""
    for index, suffix in ((3, ".running_mean_in"), (4, ".running_var_in")):
        fresh = f"{named(node)}{suffix}"
        copy = ir.Node("", "Sum", [node.inputs[index]], num_outputs=1, name=fresh)
        copy.outputs[0].name = fresh
        graph.insert_before(node, copy)
        node.replace_input_with(index, copy.outputs[0])


def _fill_outputs(node: ir.Node, suffixes: list[str]) -> list[ir.Value]:
    """Give the node exactly outputs 0..len(suffixes), naming the optional ones `<node><suffix>` where unnamed;
    return them."""
    node.resize_outputs(len(suffixes) + 1)
    for output, suffix in zip(node.outputs[1:], suffixes, strict=True):
        output.name = output.name or f"{named(node)}{suffix}"
    return list(node.outputs[1:])


def _train_batch_norm(node: ir.Node) -> list[ir.Value]:
    """Set training_mode=1 and expose the updated running mean and variance."""
    node.attributes.pop("training_mode", None)
    node.attributes["training_mode"] = ir.AttrInt64("training_mode", 1)
    return _fill_outputs(node, [".running_mean_out", ".running_var_out"])


def _train_dropout(graph: ir.Graph, node: ir.Node) -> None:
    """Feed training_mode=true and expose the mask the gradient needs."""
    flag = ir.Value(name=f"{named(node)}.training_mode", const_value=ir.tensor(np.array(True)),
                    type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    graph.register_initializer(flag)
    node.resize_inputs(3)
    node.replace_input_with(2, flag)
    _fill_outputs(node, [".mask"])


def infer(model: ir.Model) -> GraphInfo:
    """Every tensor's shape and type, resolved in place (passes/shapes.py)."""
    return GraphInfo(run_passes(model, [ResolveShapes()]))
