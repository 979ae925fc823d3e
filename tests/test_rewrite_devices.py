"""The multi-device rewrite on hand-written schedules: copy nodes, device tags, IR v11 placement, same numbers."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from conftest import conv_chain, skip_net
from onnx import TensorProto, helper, numpy_helper

from onnx_remat.core.devices import Device
from onnx_remat.core.opmap import OpMap
from onnx_remat.core.schedule import Compute, Copy, Free, Schedule
from onnx_remat.passes.execute import random_feeds, run, session_options
from onnx_remat.passes.rewrite import CONFIGURATION, rewrite
from onnx_remat.passes.runtimes import layer_assignment_settings

C, F = Compute, Free
TWO = ("a", "b")
THREE = ("a", "b", "c")


def one_node_ops(model: onnx.ModelProto) -> OpMap:
    return OpMap(tuple((node.name,) for node in model.graph.node))


def meta(node: onnx.NodeProto) -> dict[str, str]:
    return {p.key: p.value for p in node.metadata_props}


def nodes_by_name(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {node.name: node for node in model.graph.node}


def skip_split_schedule() -> Schedule:
    """skip_net(depth=4): the encoder (0-3) on a, the decoder (4-11) on b, each skip copied when it is needed.

    Operators: 0-3 enc0-enc3, then per level dec_k (Tanh) and add_k: 4 dec0, 5 add0(e3), 6 dec1, 7 add1(e2),
    8 dec2, 9 add2(e1), 10 dec3, 11 add3(e0)."""
    return Schedule((
        C(0, 0), C(1, 1), C(2, 2), C(3, 3), Copy(3, 3, 0, 1), F(3, 3),
        C(4, 4, 1), C(5, 5, 1), Copy(2, 5, 0, 1), F(2, 5), C(6, 6, 1), C(7, 7, 1), Copy(1, 7, 0, 1), F(1, 7),
        C(8, 8, 1), C(9, 9, 1), Copy(0, 9, 0, 1), F(0, 9), C(10, 10, 1), C(11, 11, 1),
    ))  # fmt: skip


def offload_schedule() -> Schedule:
    """conv_chain(depth=2) on three devices: conv0 on a, its output parked on c and freed on a, relu0 and conv1
    on b, brought back from c to a for relu1, whose output goes to c and back to a again (a second copy)."""
    return Schedule((
        C(0, 0), Copy(0, 0, 0, 2), F(0, 0), Copy(0, 1, 2, 1), C(1, 1, 1), C(2, 2, 1), Copy(2, 2, 1, 0),
        C(3, 3, 0), Copy(3, 3, 0, 2), F(3, 3), Copy(3, 3, 2, 0),
    ))  # fmt: skip


@pytest.fixture(scope="module")
def split() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    original = skip_net()
    return original, rewrite(ir.serde.deserialize_model(original), one_node_ops(original), skip_split_schedule(), TWO)


def test_copy_nodes_are_named_identities_in_schedule_order(split):
    _, model = split
    copies = [node for node in model.graph.node if node.op_type == "Identity"]
    assert [node.name for node in copies] == [f"e{k}__copy_a_to_b" for k in (3, 2, 1, 0)]
    assert all(list(node.output) == [node.name] for node in copies)
    names = [node.name for node in model.graph.node]
    assert names.index("e2__copy_a_to_b") == names.index("add0") + 1


def test_consumers_read_the_instance_on_their_device(split):
    _, model = split
    nodes = nodes_by_name(model)
    assert list(nodes["enc1"].input) == ["e0", "ew1"]
    assert list(nodes["add0"].input) == ["t0", "e3__copy_a_to_b"]
    assert list(nodes["add3"].input) == ["t3", "e0__copy_a_to_b"]
    assert list(nodes["e1__copy_a_to_b"].input) == ["e1"]


def test_every_node_is_tagged_with_its_device(split):
    _, model = split
    for node in model.graph.node:
        m = meta(node)
        assert m["layer_ann"] == m["onnx_remat.device"]
        assert m["onnx_remat.device"] == ("a" if node.name.startswith("enc") else "b")
    copy = meta(nodes_by_name(model)["e2__copy_a_to_b"])
    assert copy == {
        "onnx_remat.role": "copy", "onnx_remat.origin": "enc2", "onnx_remat.device": "b", "onnx_remat.step": "8",
        "onnx_remat.source": "a", "onnx_remat.target": "b", "layer_ann": "b",
    }


def test_ir_v11_device_configuration(split):
    _, model = split
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 11
    (configuration,) = model.configuration
    assert (configuration.name, configuration.num_devices, list(configuration.device)) == (CONFIGURATION, 2, ["a", "b"])
    nodes = nodes_by_name(model)
    (placement,) = nodes["enc0"].device_configurations
    assert placement.configuration_id == CONFIGURATION
    assert [(s.tensor_name, list(s.device)) for s in placement.sharding_spec] == [("e0", [0])]
    (copy,) = nodes["e0__copy_a_to_b"].device_configurations
    assert [(s.tensor_name, list(s.device)) for s in copy.sharding_spec] == [("e0", [0]), ("e0__copy_a_to_b", [1])]


def test_runs_in_plain_onnxruntime_with_the_original_numbers(split):
    original, model = split
    feeds = random_feeds(original, seed=0)
    for got, want in zip(run(model, feeds), run(original, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_layer_assignment_settings_pin_the_nodes_in_onnxruntime(split):
    original, model = split
    devices = [Device("a", "onnxruntime", "CPUExecutionProvider"), Device("b", "openvino", "CPU")]
    settings = layer_assignment_settings(devices)
    assert settings == "cpu(=a)"
    options = session_options()
    options.add_session_config_entry("session.layer_assignment_settings", settings)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = random_feeds(original, seed=0)
    np.testing.assert_allclose(session.run(None, feeds)[0], run(original, feeds)[0], rtol=0, atol=1e-6)


def test_three_devices_with_an_offload_and_a_second_copy():
    original = conv_chain(depth=2)
    model = rewrite(ir.serde.deserialize_model(original), one_node_ops(original), offload_schedule(), THREE)
    onnx.checker.check_model(model, full_check=True)
    names = [node.name for node in model.graph.node]
    assert names == [
        "conv0", "c0__copy_a_to_c", "c0__copy_c_to_b", "relu0", "conv1", "c1__copy_b_to_a", "relu1",
        "output__copy_a_to_c", "output__copy_c_to_a",
    ]
    nodes = nodes_by_name(model)
    assert list(nodes["relu0"].input) == ["c0__copy_c_to_b"]
    assert list(nodes["relu1"].input) == ["c1__copy_b_to_a"]
    # The graph output is carried by its last instance: the copy back to a.
    assert list(nodes["relu1"].output) == ["output__remat0"]
    assert list(nodes["output__copy_c_to_a"].output) == ["output"]
    feeds = random_feeds(original, seed=0)
    np.testing.assert_allclose(run(model, feeds)[0], run(original, feeds)[0], rtol=0, atol=1e-6)


def test_repeated_copies_between_the_same_devices_are_numbered():
    original = conv_chain(depth=1)
    schedule = Schedule((
        C(0, 0), Copy(0, 0, 0, 1), F(0, 0), Copy(0, 1, 1, 0), F(0, 1), Copy(0, 1, 0, 1), C(1, 1, 1),
    ))  # fmt: skip
    model = rewrite(ir.serde.deserialize_model(original), one_node_ops(original), schedule, TWO)
    assert [node.name for node in model.graph.node] == [
        "conv0", "c0__copy_a_to_b", "c0__copy_b_to_a", "c0__copy1_a_to_b", "relu0",
    ]
    assert list(nodes_by_name(model)["relu0"].input) == ["c0__copy1_a_to_b"]


def split_model() -> onnx.ModelProto:
    """x -> split (two halves) -> tanh(first half), relu(second half) -> add."""
    nodes = [
        helper.make_node("Split", ["x"], ["h0", "h1"], name="split", axis=1, num_outputs=2),
        helper.make_node("Tanh", ["h0"], ["t"], name="tanh"),
        helper.make_node("Relu", ["h1"], ["r"], name="relu"),
        helper.make_node("Add", ["t", "r"], ["y"], name="add"),
    ]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "split", [value("x", TensorProto.FLOAT, [1, 4, 8])], [value("y", TensorProto.FLOAT, [1, 2, 8])]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_a_copy_moves_every_output_and_unread_ones_are_dropped():
    original = split_model()
    schedule = Schedule((
        C(0, 0), Copy(0, 0, 0, 1), C(1, 1, 1), Copy(1, 1, 1, 0), C(2, 2), C(3, 3),
    ))  # fmt: skip
    model = rewrite(ir.serde.deserialize_model(original), one_node_ops(original), schedule, TWO)
    onnx.checker.check_model(model, full_check=True)
    # The copy of split moved h0 and h1; nothing on b reads h1, so its copy is gone.
    assert [node.name for node in model.graph.node] == ["split", "h0__copy_a_to_b", "tanh", "t__copy_b_to_a",
                                                        "relu", "add"]
    feeds = random_feeds(original, seed=0)
    np.testing.assert_allclose(run(model, feeds)[0], run(original, feeds)[0], rtol=0, atol=1e-6)


def test_a_tensor_read_on_a_device_without_it_is_refused():
    original = conv_chain(depth=1)
    with pytest.raises(ValueError, match="relu0 on b reads 'c0'"):
        rewrite(ir.serde.deserialize_model(original), one_node_ops(original), Schedule((C(0, 0), C(1, 1, 1))), TWO)


def test_one_device_stays_at_ir_10_without_configuration():
    original = conv_chain(depth=1)
    model = rewrite(ir.serde.deserialize_model(original), one_node_ops(original), Schedule((C(0, 0), C(1, 1))))
    assert model.ir_version == 10 and not model.configuration
    assert all(not node.device_configurations and meta(node)["layer_ann"] == "cpu" for node in model.graph.node)


def test_weights_are_shared_not_copied():
    """Parameters are held on every device: a node on b reads the initializer itself."""
    weight = numpy_helper.from_array(np.ones((2, 8), np.float32), "w")
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("MatMul", ["w", "r"], ["y"], name="mm")],
        "mm", [value("x", TensorProto.FLOAT, [8, 3])], [value("y", TensorProto.FLOAT, [2, 3])], [weight],
    )
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    schedule = Schedule((C(0, 0), Copy(0, 0, 0, 1), C(1, 1, 1)))
    model = rewrite(ir.serde.deserialize_model(original), one_node_ops(original), schedule, TWO)
    assert list(nodes_by_name(model)["mm"].input) == ["w", "r__copy_a_to_b"]
