"""The rewrite pass on hand-written schedules: valid ONNX, same numbers, recomputations really run."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from conftest import conv_chain, skip_net
from onnx import TensorProto, helper, numpy_helper

from onnx_remat.core.errors import ModelError
from onnx_remat.core.opmap import OpMap
from onnx_remat.core.schedule import Compute, Free, Schedule
from onnx_remat.passes.execute import executed_node_names, random_feeds, run
from onnx_remat.passes.manager import to_proto
from onnx_remat.passes.rewrite import rewrite
from onnx_remat.pipeline import prepare

C, F = Compute, Free


def one_node_ops(model: onnx.ModelProto) -> OpMap:
    """One operator per node, in graph order."""
    return OpMap(tuple((node.name,) for node in model.graph.node))


def skip_remat_schedule() -> Schedule:
    """skip_net(depth=4): free the encoder outputs e0, e1 early and recompute them for the decoder's adds.

    Operators: 0-3 enc0-enc3 (Conv), then per level dec_k (Tanh) and add_k: 4 dec0, 5 add0(e3), 6 dec1,
    7 add1(e2), 8 dec2, 9 add2(e1), 10 dec3, 11 add3(e0).
    """
    return Schedule((
        C(0, 0), C(1, 1), F(0, 1), C(2, 2), F(1, 2), C(3, 3), C(4, 4), C(5, 5), F(3, 5), F(4, 5),
        C(6, 6), F(5, 6), C(7, 7), F(6, 7), F(2, 7), C(8, 8), F(7, 8),
        C(0, 9), C(1, 9), F(0, 9), C(9, 9), F(8, 9), F(1, 9),
        C(10, 10), F(9, 10), C(0, 11), C(11, 11), F(10, 11), F(0, 11),
    ))  # fmt: skip


def chain_remat_schedule(ops: int) -> Schedule:
    """A chain computed in order, with operator 2 recomputed (from the still-held output of 1) for 3."""
    events = [C(0, 0), C(1, 1), F(0, 1), C(2, 2), C(2, 3), F(1, 3), C(3, 3), F(2, 3)]
    for op in range(4, ops):
        events += [C(op, op), F(op - 1, op)]
    return Schedule(tuple(events))


def expected_node_names(opmap: OpMap, schedule: Schedule) -> list[str]:
    """Node names in schedule order, suffixed per recomputation."""
    names, seen = [], {}
    for event in schedule.computes:
        k = seen.get(event.op, 0)
        seen[event.op] = k + 1
        names += [name + (f"__remat{k}" if k else "") for name in opmap.node_names[event.op]]
    return names


def meta(node: onnx.NodeProto) -> dict[str, str]:
    return {p.key: p.value for p in node.metadata_props}


def scheduled(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes the schedule computes: all but the Size nodes that release unread outputs."""
    return [node for node in model.graph.node if meta(node)["onnx_remat.role"] != "release"]


CASES = {
    "chain": (conv_chain, lambda model: chain_remat_schedule(len(model.graph.node))),
    "skip": (skip_net, lambda model: skip_remat_schedule()),
}


@pytest.fixture(params=sorted(CASES))
def rewritten(request):
    """(original, opmap, schedule, rewritten) for each case."""
    build, schedule_for = CASES[request.param]
    original = build()
    opmap, schedule = one_node_ops(original), schedule_for(original)
    return original, opmap, schedule, rewrite(ir.serde.deserialize_model(original), opmap, schedule)


def test_output_is_valid_onnx_at_ir_10(rewritten):
    _, _, _, model = rewritten
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 10


def test_outputs_equal_the_original(rewritten):
    original, _, _, model = rewritten
    feeds = random_feeds(original, seed=0)
    for got, want in zip(run(model, feeds), run(original, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_nodes_follow_schedule_order_and_run_in_it(rewritten):
    original, opmap, schedule, model = rewritten
    names = [node.name for node in scheduled(model)]
    assert names == expected_node_names(opmap, schedule)
    executed = executed_node_names(model, random_feeds(original))
    assert executed == [node.name for node in model.graph.node]


def test_an_output_nobody_reads_is_released_right_after_its_producer():
    """The chain's first computation of conv1 is read by nobody (its reader reads the recomputation): a Size node
    reads it at once, so onnxruntime frees it there instead of holding it to the end of the run."""
    original = conv_chain()
    opmap = one_node_ops(original)
    model = rewrite(ir.serde.deserialize_model(original), opmap, chain_remat_schedule(len(original.graph.node)))
    names = [node.name for node in model.graph.node]
    release = model.graph.node[names.index("conv1") + 1]
    assert (release.op_type, list(release.input)) == ("Size", list(model.graph.node[names.index("conv1")].output))
    assert meta(release)["onnx_remat.role"] == "release" and meta(release)["onnx_remat.origin"] == "conv1"
    readers = {name: [node.name for node in model.graph.node if name in node.input] for node in model.graph.node
               for name in node.output}
    assert all(readers[name] for node in scheduled(model) for name in node.output
               if name not in {output.name for output in model.graph.output})


def test_recomputations_survive_loading(rewritten):
    original, _, schedule, model = rewritten
    executed = executed_node_names(model, random_feeds(original))
    recomputes = [name for name in executed if "__remat" in name]
    assert len(recomputes) == schedule.recompute_count() > 0


def test_metadata_says_role_origin_device_and_step(rewritten):
    _, _, schedule, model = rewritten
    steps = [step for step, event in enumerate(schedule.events) if isinstance(event, Compute)]
    for node, step in zip(scheduled(model), steps, strict=True):
        m = meta(node)
        assert m["onnx_remat.role"] == ("recompute" if "__remat" in node.name else "forward")
        assert m["onnx_remat.origin"] == node.name.split("__remat")[0]
        assert m["onnx_remat.device"] == "cpu"
        assert m["onnx_remat.step"] == str(step)


def test_consumers_read_the_latest_instance():
    original = skip_net()
    model = rewrite(ir.serde.deserialize_model(original), one_node_ops(original), skip_remat_schedule())
    inputs = {node.name: list(node.input) for node in model.graph.node}
    assert inputs["enc1"] == ["e0", "ew1"]
    assert inputs["enc1__remat1"] == ["e0__remat1", "ew1"]
    assert inputs["add2"] == ["t2", "e1__remat1"]
    assert inputs["add3"] == ["t3", "e0__remat2"]


def test_the_rewrite_leaves_its_input_as_it_was():
    """A functional pass: the same onnx-ir model rewritten twice gives the same graph, and still reads as the original
    (faster_by_running and a sweep rewrite one prepared model several times)."""
    original = skip_net()
    model = ir.serde.deserialize_model(original)
    first = rewrite(model, one_node_ops(original), skip_remat_schedule())
    assert rewrite(model, one_node_ops(original), skip_remat_schedule()) == first
    assert to_proto(model).graph == original.graph


def mid_output_model() -> onnx.ModelProto:
    """x -> conv0 -> mid (a graph output, also read by tanh1) -> tanh1 -> tanh2 -> out."""
    weight = numpy_helper.from_array(np.full((4, 4, 3, 3), 0.05, np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["mid"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Tanh", ["mid"], ["t1"], name="tanh1"),
        helper.make_node("Tanh", ["t1"], ["out"], name="tanh2"),
    ]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "mid_output", [value("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [value("mid", TensorProto.FLOAT, [1, 4, 8, 8]), value("out", TensorProto.FLOAT, [1, 4, 8, 8])], [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_graph_output_is_carried_by_the_last_instance():
    original = mid_output_model()
    schedule = Schedule((C(0, 0), C(1, 1), F(0, 1), C(2, 2), F(1, 2), C(0, 2)))
    model = rewrite(ir.serde.deserialize_model(original), one_node_ops(original), schedule)
    onnx.checker.check_model(model, full_check=True)
    outputs = {node.name: list(node.output) for node in model.graph.node}
    assert outputs["conv0"] == ["mid__remat0"] and outputs["conv0__remat1"] == ["mid"]
    assert [node.input[0] for node in model.graph.node if node.name == "tanh1"] == ["mid__remat0"]
    feeds = random_feeds(original)
    for got, want in zip(run(model, feeds), run(original, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_unread_optional_outputs_of_recomputations_are_dropped():
    nodes = [
        helper.make_node("MaxPool", ["x"], ["p", "idx"], name="pool", kernel_shape=[2, 2]),
        helper.make_node("Tanh", ["p"], ["t"], name="tanh"),
        helper.make_node("Add", ["t", "p"], ["y"], name="add"),
    ]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "pool", [value("x", TensorProto.FLOAT, [1, 2, 8, 8])], [value("y", TensorProto.FLOAT, [1, 2, 7, 7])]
    )
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    schedule = Schedule((C(0, 0), C(1, 1), F(0, 1), C(0, 2), C(2, 2)))
    model = rewrite(ir.serde.deserialize_model(original), one_node_ops(original), schedule)
    onnx.checker.check_model(model, full_check=True)
    # the indices left out (a trailing blank output is no output at all: onnx-ir writes none)
    assert [list(node.output) for node in model.graph.node if node.name == "pool__remat1"] == [["p__remat1"]]
    feeds = random_feeds(original)
    np.testing.assert_allclose(run(model, feeds)[0], run(original, feeds)[0], rtol=0, atol=1e-6)


def test_nodes_outside_the_opmap_are_refused():
    original = conv_chain(depth=2)
    opmap = OpMap(tuple((node.name,) for node in original.graph.node[:-1]))
    with pytest.raises(ValueError, match="relu1"):
        rewrite(ir.serde.deserialize_model(original), opmap, Schedule(tuple(C(op, op) for op in range(3))))


def test_a_recomputation_read_only_by_dropped_nodes_is_dropped_too():
    """Operator 1 is two nodes; recomputed for operator 4, which reads only one of them, it loses the other, and then
    the recomputation of operator 0 that only the lost node read goes too: onnxruntime would hold its output to the
    end of the run, which the schedule does not count (an LSTM training step held 2 MiB so)."""
    value = helper.make_tensor_value_info
    nodes = [helper.make_node("Neg", ["x"], ["t"], name="a"), helper.make_node("Relu", ["t"], ["u"], name="b"),
             helper.make_node("Abs", ["x"], ["v"], name="c"), helper.make_node("Add", ["u", "v"], ["w"], name="d"),
             helper.make_node("Sub", ["w", "x"], ["y"], name="e"), helper.make_node("Neg", ["v"], ["z"], name="f")]
    graph = helper.make_graph(nodes, "g", [value("x", TensorProto.FLOAT, [4, 8])],
                              [value("y", TensorProto.FLOAT, [4, 8]), value("z", TensorProto.FLOAT, [4, 8])])
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    opmap = OpMap((("a",), ("b", "c"), ("d",), ("e",), ("f",)))
    C, F = Compute, Free
    schedule = Schedule((C(0, 0), C(1, 1), F(0, 1), C(2, 2), F(1, 2), C(3, 3), F(2, 3),
                         C(0, 4), C(1, 4), F(0, 4), C(4, 4), F(1, 4)))
    model = rewrite(ir.serde.deserialize_model(original), opmap, schedule)
    assert [node.name for node in model.graph.node] == ["a", "b", "c", "d", "e", "c__remat1", "f"]
    feeds = random_feeds(original, seed=0)
    for got, want in zip(run(model, feeds), run(original, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=0)


def test_a_split_read_in_part_becomes_slices_of_the_parts_read():
    """Each instance of a Split serves one of its two readers: onnxruntime would hold the other, unread output to
    the end of the run, so each becomes a Slice of the part read (tagged as the Split)."""
    value = helper.make_tensor_value_info
    nodes = [helper.make_node("Split", ["x"], ["a", "b"], name="split", axis=1, num_outputs=2),
             helper.make_node("Relu", ["a"], ["y"], name="relu"), helper.make_node("Neg", ["b"], ["z"], name="neg")]
    graph = helper.make_graph(nodes, "g", [value("x", TensorProto.FLOAT, [4, 6])],
                              [value("y", TensorProto.FLOAT, [4, 3]), value("z", TensorProto.FLOAT, [4, 3])])
    original = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10))
    C, F = Compute, Free
    schedule = Schedule((C(0, 0), C(1, 1), F(0, 1), C(0, 2), C(2, 2), F(0, 2)))
    model = rewrite(ir.serde.deserialize_model(original), one_node_ops(original), schedule)
    assert [(node.op_type, meta(node)["onnx_remat.origin"]) for node in model.graph.node] == [
        ("Slice", "split"), ("Relu", "relu"), ("Slice", "split"), ("Neg", "neg")]
    onnx.checker.check_model(model, full_check=True)
    feeds = random_feeds(original, seed=0)
    for got, want in zip(run(model, feeds), run(original, feeds), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_branch_returning_an_outer_value_directly_never_reaches_the_rewrite():
    """An If branch whose output is an outer tensor itself (no node inside) would keep returning the first instance
    of a recomputed tensor; no such model gets here: the ONNX checker refuses it on load, and onnxruntime refuses to
    run it (an Identity inside the branch is what both ask for, and the rewrite repoints that node's read)."""
    width = 8
    tensor = helper.make_tensor_value_info
    then = helper.make_graph([], "then", [], [tensor("a", TensorProto.FLOAT, [width])])
    other = helper.make_graph([helper.make_node("Neg", ["a"], ["negated"])], "else", [],
                              [tensor("negated", TensorProto.FLOAT, [width])])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("If", ["flag"], ["y"], name="branch", then_branch=then, else_branch=other)]
    graph = helper.make_graph(nodes, "returns_outer", [tensor("x", TensorProto.FLOAT, [width]),
                                                       tensor("flag", TensorProto.BOOL, [])],
                              [tensor("y", TensorProto.FLOAT, [width])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelError, match="fails the ONNX checker"):
        prepare(model)
    feeds = {"x": np.ones(width, np.float32), "flag": np.array(True)}
    with pytest.raises(Exception, match="outer scope value being returned directly"):
        run(model, feeds)
