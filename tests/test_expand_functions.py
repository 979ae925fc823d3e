"""ExpandFunctions: ops onnxruntime would inline out of the file's order are expanded in place by prepare, computing
the same outputs, and a rewritten model with them runs in the order written."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_autodiff_rules import run_openvino

import onnx_remat
from onnx_remat.core.tags import EXPANDED_FROM, node_tags
from onnx_remat.passes.execute import executed_node_names, random_feeds, run
from onnx_remat.passes.expand_functions import ExpandFunctions
from onnx_remat.passes.manager import run_passes, to_proto
from onnx_remat.pipeline import prepare

INLINED = {"HardSwish", "CastLike", "Mish", "GroupNormalization"}


def function_ops_model(opset: int = 21) -> onnx.ModelProto:
    """Conv -> HardSwish -> GroupNormalization -> Mish -> CastLike(to the input's type) -> Conv at `opset` (the
    bodies in effect at 20 were written for 18 and 19; GroupNormalization-18, deprecated at 20, is an Identity)."""
    rng = np.random.default_rng(0)
    normalize = helper.make_node("GroupNormalization", ["h", "scale", "bias"], ["g"], name="gnorm", num_groups=2)
    weights = [numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), f"w{i}") for i in (0, 1)]
    weights += [numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) + 1, "scale"),
                numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "bias")]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("HardSwish", ["c0"], ["h"], name="hswish"),
        normalize if opset >= 21 else helper.make_node("Identity", ["h"], ["g"], name="gnorm"),
        helper.make_node("Mish", ["g"], ["m"], name="mish"),
        helper.make_node("CastLike", ["m", "x"], ["cl"], name="castlike"),
        helper.make_node("Conv", ["cl", "w1"], ["y"], name="conv1", pads=[1, 1, 1, 1]),
    ]
    x, y = (helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 8, 6, 6]) for name in "xy")
    graph = helper.make_graph(nodes, "function_ops", [x], [y], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def hardswish_net(depth: int = 4) -> onnx.ModelProto:
    """Convs, each followed by a HardSwish and the next reading the last two activations (a chain with skips)."""
    rng = np.random.default_rng(1)
    nodes, weights, previous = [], [], ["x", "x"]
    for i in range(depth):
        weights.append(numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.3, f"w{i}"))
        nodes += [helper.make_node("Add", previous, [f"a{i}"], name=f"add{i}"),
                  helper.make_node("Conv", [f"a{i}", f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("HardSwish", [f"c{i}"], [f"h{i}"], name=f"hswish{i}")]
        previous = [previous[1], f"h{i}"]
    nodes.append(helper.make_node("ReduceSum", [previous[1]], ["y"], name="sum", keepdims=0))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])
    graph = helper.make_graph(nodes, "hardswish_net", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
                              weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("opset", [20, 21])
def test_prepare_expands_function_ops_into_nodes_that_compute_the_same(opset):
    original = function_ops_model(opset)
    expanded = prepare(original).proto
    ops = [node.op_type for node in expanded.graph.node]
    assert not INLINED & set(ops)
    assert ops[0] == "Conv" and ops[-1] == "Conv" and "HardSigmoid" in ops and "Cast" in ops
    feeds = random_feeds(original, seed=0)
    want = run(original, feeds)
    np.testing.assert_allclose(run(expanded, feeds)[0], want[0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(run_openvino(expanded, feeds)["y"], want[0], rtol=1e-4, atol=1e-4)


def test_expanded_nodes_name_and_tag_the_node_they_come_from():
    model = run_passes(ir.serde.deserialize_model(function_ops_model()), [ExpandFunctions()])
    origins = {node.name: node.metadata_props.get(EXPANDED_FROM) for node in model.graph}
    assert origins["conv0"] is None and origins["conv1"] is None
    hardswish = [name for name, origin in origins.items() if origin == "hswish (HardSwish)"]
    assert [model.graph.node(name).op_type for name in hardswish] == ["HardSigmoid", "Mul"]
    assert all(name.startswith("hswish/") for name in hardswish)
    assert len(set(origins)) == len(origins)
    assert [value.name for value in model.graph.outputs] == ["y"]


def test_expansion_keeps_attributes_the_body_refers_to():
    """GroupNormalization's body reads epsilon and num_groups from the node, epsilon from the schema's default."""
    model = run_passes(ir.serde.deserialize_model(function_ops_model()), [ExpandFunctions()])
    proto = to_proto(model)
    feeds = random_feeds(proto, seed=1)
    np.testing.assert_allclose(run(proto, feeds)[0], run(function_ops_model(), feeds)[0], rtol=0, atol=1e-6)


def test_rewritten_model_with_hardswish_runs_in_file_order():
    """As written, onnxruntime inlines HardSwish and runs the body after every other ready node."""
    original = hardswish_net()
    feeds = random_feeds(original, seed=0)
    as_written = executed_node_names(original, feeds)
    assert as_written != [node.name for node in original.graph.node if node.name in as_written]
    result = onnx_remat.remat(original, "min", mode="train", time_limit=5)
    ran = executed_node_names(result.model, random_feeds(result.model, seed=0))
    assert ran == [node.name for node in result.model.graph.node if node.name in set(ran)]
    expanded = [node for node in result.model.graph.node if node.op_type == "HardSigmoid"]
    assert expanded and all(node_tags(node).role and {p.key: p.value for p in node.metadata_props}
                            .get(EXPANDED_FROM, "").endswith("(HardSwish)") for node in expanded)
