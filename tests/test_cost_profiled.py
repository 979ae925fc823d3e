"""Measured costs on the two CPU engines, each operator alone or inside whole-model runs: one per operator, positive,
cached under a key that follows the graph, with copy costs. Real runtime runs, no timed assertions: what is checked
is which operators got a time, never how large it is."""

import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_remat.core.devices import get_devices, preset
from onnx_remat.core.errors import RematWarning
from onnx_remat.models import FIXTURES, build
from onnx_remat.passes import cost_profiled
from onnx_remat.passes.build_problem import build_problem
from onnx_remat.passes.cost_profiled import ProfiledCosts, profile_costs
from onnx_remat.passes.execute import random_feeds
from onnx_remat.passes.runtimes import runtime_for
from onnx_remat.passes.shapes import resolve_shapes
from onnx_remat.passes.sizes import TensorInfo, tensor_infos
from onnx_remat.pipeline import RematOptions, costed, costed_problem, prepare

GROUPS = [("conv_small",), ("relu", "add"), ("shape",), ("reshape",), ("conv_big",)]


def small_and_big_conv() -> onnx.ModelProto:
    """A small conv/relu/add block with a shape-driven reshape, and a conv about a thousand times the work."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w_small"),
        numpy_helper.from_array(rng.standard_normal((64, 64, 3, 3)).astype(np.float32), "w_big"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w_small"], ["c"], name="conv_small", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "x"], ["a"], name="add"),
        helper.make_node("Constant", [], ["flat"], name="flat_shape",
                         value=numpy_helper.from_array(np.array([1, -1], np.int64))),
        helper.make_node("Reshape", ["a", "flat"], ["f"], name="flatten_reshape"),
        helper.make_node("Shape", ["a"], ["s"], name="shape"),
        helper.make_node("Reshape", ["f", "s"], ["small_out"], name="reshape"),
        helper.make_node("Conv", ["y", "w_big"], ["big_out"], name="conv_big", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes, "small_and_big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 64, 64])],
        [helper.make_tensor_value_info("small_out", TensorProto.FLOAT, [1, 8, 16, 16]),
         helper.make_tensor_value_info("big_out", TensorProto.FLOAT, [1, 64, 64, 64])],
        weights,
    )
    return resolve_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))


def on_ir(model: onnx.ModelProto) -> tuple[ir.Model, dict[str, TensorInfo]]:
    """`model` on onnx-ir and its tensors, as profile_costs takes them."""
    return ir.serde.deserialize_model(model), tensor_infos(model)


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return small_and_big_conv()


@pytest.fixture(scope="module")
def devices():
    return preset("ort-cpu+ov-cpu")


@pytest.fixture(scope="module")
def measured(model, devices, tmp_path_factory) -> tuple[ProfiledCosts, object]:
    cache = tmp_path_factory.mktemp("costs")
    groups = GROUPS[:3] + [("flatten_reshape",)] + GROUPS[3:]
    return profile_costs(*on_ir(model), groups, devices, repeats=5, cache_dir=cache), cache


def test_costs_are_positive_and_finite(measured, devices):
    costs, _ = measured
    assert not costs.from_cache
    assert costs.devices == ("ort-cpu", "ov-cpu")
    for device in devices:
        assert len(costs.cost[device.name]) == 6
        assert all(math.isfinite(c) and c > 0 for c in costs.cost[device.name])
        assert costs.run_overhead_seconds[device.name] > costs.call_overhead_seconds[device.name] > 0


def test_copy_costs_between_engines(measured):
    costs, _ = measured
    for d in range(2):
        assert costs.copy_seconds_per_byte[d][d] == costs.copy_fixed_seconds[d][d] == 0
        assert costs.copy_seconds_per_byte[d][1 - d] > 0
        assert costs.copy_fixed_seconds[d][1 - d] > 0


def test_second_call_is_served_from_the_cache(measured, model, devices, monkeypatch):
    costs, cache = measured

    def no_runtime(*args):
        raise AssertionError("the cache should have answered")

    monkeypatch.setattr(cost_profiled, "_measure", no_runtime)
    groups = GROUPS[:3] + [("flatten_reshape",)] + GROUPS[3:]
    again = profile_costs(*on_ir(model), groups, devices, repeats=5, cache_dir=cache)
    assert again.from_cache
    assert again.to_json() == costs.to_json()
    with pytest.raises(AssertionError, match="cache should have answered"):
        profile_costs(*on_ir(model), groups[:-1], devices, repeats=5, cache_dir=cache)


def test_cache_key_ignores_weights_but_not_shapes_attributes_or_ops(model, devices):
    groups = [tuple(g) for g in GROUPS]
    key = cost_profiled.cache_key(*on_ir(model), groups, devices, 5)
    other_weights = onnx.ModelProto()
    other_weights.CopyFrom(model)
    other_weights.graph.initializer[0].CopyFrom(
        numpy_helper.from_array(np.zeros((8, 8, 3, 3), np.float32), "w_small"))
    assert cost_profiled.cache_key(*on_ir(other_weights), groups, devices, 5) == key
    assert cost_profiled.cache_key(*on_ir(model), groups, devices[:1], 5) != key
    dilated = onnx.ModelProto()  # the same shapes, other work
    dilated.CopyFrom(model)
    conv = dilated.graph.node[0]
    del conv.attribute[:]
    conv.attribute.extend([helper.make_attribute("pads", [2, 2, 2, 2]), helper.make_attribute("dilations", [2, 2])])
    assert cost_profiled.cache_key(*on_ir(dilated), groups, devices, 5) != key
    other_op = onnx.ModelProto()
    other_op.CopyFrom(model)
    other_op.graph.node[1].op_type = "Sigmoid"
    assert cost_profiled.cache_key(*on_ir(other_op), groups, devices, 5) != key
    other_shapes = onnx.ModelProto()
    other_shapes.CopyFrom(model)
    other_shapes.graph.input[1].type.tensor_type.shape.dim[2].dim_value = 32
    assert cost_profiled.cache_key(*on_ir(other_shapes), groups, devices, 5) != key


def test_apply_puts_measured_costs_into_a_problem(model, devices, tmp_path):
    """Costs are measured for the problem's operators (the view flatten_reshape joins the group it reshapes)."""
    infos = tensor_infos(model)
    groups = [g for g in (GROUPS[:3] + [("flatten_reshape",)] + GROUPS[3:])]
    analytic = {name: (lambda node, infos: 1.0) for name in ("ov-cpu", "ort-cpu")}
    ir_model = ir.serde.deserialize_model(model)
    graph = build_problem(ir_model, infos, analytic, lambda node, infos: 0, groups)
    assert ("relu", "add", "flatten_reshape") in graph.opmap.node_names
    costs = profile_costs(ir_model, infos, graph.opmap.node_names, devices, repeats=5, cache_dir=tmp_path)
    problem = costs.apply(graph.problem)
    assert problem.cost == (costs.cost["ov-cpu"], costs.cost["ort-cpu"])
    assert problem.copy_seconds_per_byte[0][1] == costs.copy_seconds_per_byte[1][0]
    assert problem.copy_fixed_seconds[0][1] == costs.copy_fixed_seconds[1][0] > 0
    with pytest.raises(ValueError, match="no profiled costs for device 'gpu'"):
        costs.apply(build_problem(ir_model, infos, {"gpu": analytic["ov-cpu"]}, lambda n, i: 0, groups).problem)


@pytest.fixture(scope="module")
def in_graph(model, devices, tmp_path_factory) -> ProfiledCosts:
    groups = GROUPS[:3] + [("flatten_reshape",)] + GROUPS[3:]
    return profile_costs(*on_ir(model), groups, devices, repeats=5, cache_dir=tmp_path_factory.mktemp("in-graph"),
                         method="in-graph")


def test_in_graph_costs_cover_every_operator(in_graph, devices):
    """Timed inside whole-model runs: a finite, positive cost for each of the 6 operators on each device, and the same
    copy model as operators timed alone."""
    for device in devices:
        values = in_graph.cost[device.name]
        assert len(values) == 6 and all(math.isfinite(c) and c > 0 for c in values)
    assert in_graph.copy_seconds_per_byte[0][1] > 0 and in_graph.copy_fixed_seconds[1][0] > 0


@pytest.mark.parametrize("mode", ["infer", "train"])
def test_onnxruntime_profile_times_every_operator(mode):
    """Every operator of the U-Net fixture's graph (inference, and its training step with the backward nodes grouped
    with their layers) gets time from onnxruntime's per-node profile in every profiled run, and every name the
    profile reports belongs to an operator: in-graph costs leave no operator to the per-node overhead alone."""
    prepared = prepare(FIXTURES / "unet_small.onnx", mode)
    groups = costed_problem(prepared, get_devices(None)).opmap.node_names
    outputs = {node.name: node.output for node in prepared.proto.graph.node}
    owner = {name: g for g, group in enumerate(groups) for node in group for name in (node, *outputs[node]) if name}
    runtime = runtime_for(get_devices(None)[0])
    runs = runtime.node_seconds(prepared.proto, random_feeds(prepared.proto, seed=0), runs=2)
    assert len(runs) == 2
    for timed in runs:
        owners = [cost_profiled._owner(name, owner) for name in timed]
        assert None not in owners
        assert set(owners) == set(range(len(groups)))


def test_in_graph_is_cached_apart_from_profiled(model, devices):
    groups = [tuple(g) for g in GROUPS]
    alone = cost_profiled.cache_key(*on_ir(model), groups, devices, 5)
    assert cost_profiled.cache_key(*on_ir(model), groups, devices, 5, "in-graph") != alone
    with pytest.raises(ValueError, match="unknown profiling method"):
        profile_costs(*on_ir(model), groups, devices, method="guess")


@pytest.mark.parametrize("name", ["ort-cpu", "ov-cpu"])
def test_runtimes_name_the_nodes_they_time(name, devices):
    """Every node onnxruntime reports inside a VGG16 training step is an ONNX node of it, by name; of OpenVINO's, all
    but a few of its own (3 of 172 measured, fused multiplies) are, by the node's name or the name of a tensor the
    node makes (its reorders)."""
    model = prepare(build("vgg16", batch=1, resolution=32), "train").proto
    owner = {node.name: k for k, node in enumerate(model.graph.node)}
    owner.update({out: k for k, node in enumerate(model.graph.node) for out in node.output if out})
    runtime = runtime_for(next(d for d in devices if d.name == name))
    (timed,) = runtime.node_seconds(model, random_feeds(model, seed=0), runs=1)
    unplaced = [node for node in timed if cost_profiled._owner(node, owner) is None]
    assert len(unplaced) <= (0.05 * len(timed) if name == "ov-cpu" else 0) and timed


def test_owner_finds_the_longest_known_prefix():
    owner = {"conv": 0, "conv.out": 1, "grad.w": 2}
    assert cost_profiled._owner("conv.out", owner) == 1
    assert cost_profiled._owner("conv.out_acdb_abcd/sink_port_0", owner) == 1
    assert cost_profiled._owner("grad.w_abcd", owner) == 2
    assert cost_profiled._owner("convolution", owner) is None


def _corrupt(text: Callable[[str], str]) -> Callable[[Path], None]:
    return lambda path: path.write_text(text(path.read_text()))


def _edited(field: str, change: Callable[[Any], Any]) -> Callable[[Path], None]:
    return _corrupt(lambda text: json.dumps({**json.loads(text), field: change(json.loads(text)[field])}))


CACHE_FAULTS = {
    "truncated": _corrupt(lambda text: text[: len(text) // 2]),
    "garbage": _corrupt(lambda text: "\x00\x01 not json"),
    "empty object": _corrupt(lambda text: "{}"),
    "a list": _corrupt(lambda text: "[1, 2]"),
    "one operator short": _edited("cost", lambda cost: {k: v[:-1] for k, v in cost.items()}),
    "NaN time": _edited("cost", lambda cost: {k: [math.nan, *v[1:]] for k, v in cost.items()}),
    "negative time": _edited("call_overhead_seconds", lambda overhead: dict.fromkeys(overhead, -1.0)),
    "CPU share above 1": _edited("cpu_share", lambda share: {"ort-cpu": 1.5}),
    "text for a time": _edited("cost", lambda cost: {k: ["fast", *v[1:]] for k, v in cost.items()}),
    "a folder": lambda path: (path.unlink(), path.mkdir()),
}


@pytest.mark.parametrize("fault", list(CACHE_FAULTS))
def test_a_bad_cache_entry_is_measured_again_and_rewritten(model, devices, tmp_path, monkeypatch, fault):
    """Every fault of a cached entry: one warning, the costs measured again (real runs), the entry rewritten so the
    next call is served from it."""
    groups, one = GROUPS[:2], devices[:1]
    first = profile_costs(*on_ir(model), groups, one, repeats=1, cache_dir=tmp_path)
    (entry,) = tmp_path.glob("costs-*.json")
    CACHE_FAULTS[fault](entry)
    with pytest.warns(RematWarning, match=f"cost cache entry {entry} is unusable .*: measuring again"):
        again = profile_costs(*on_ir(model), groups, one, repeats=1, cache_dir=tmp_path)
    assert not again.from_cache and len(again.cost[one[0].name]) == len(groups)
    if fault == "a folder":
        return
    assert ProfiledCosts.from_json(json.loads(entry.read_text())) == dataclasses.replace(again, from_cache=False)
    monkeypatch.setattr(cost_profiled, "_measure", lambda *args: pytest.fail("the rewritten entry should answer"))
    assert profile_costs(*on_ir(model), groups, one, repeats=1, cache_dir=tmp_path).from_cache
    assert first.devices == again.devices


def test_an_unwritable_cache_is_a_warning(model, devices, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.warns(RematWarning, match="cannot write the cost cache .*: costs not cached"):
        costs = profile_costs(*on_ir(model), GROUPS[:2], devices[:1], repeats=1, cache_dir=blocker / "cache")
    assert not costs.from_cache
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_measuring_past_its_deadline_stops_and_caches_nothing(model, devices, tmp_path):
    with pytest.raises(cost_profiled.OutOfTime, match="0 of"):
        profile_costs(*on_ir(model), GROUPS, devices[:1], repeats=1, cache_dir=tmp_path,
                      deadline=time.perf_counter())
    assert list(tmp_path.iterdir()) == []


def test_costs_not_measured_within_their_share_of_the_time_limit_are_the_rooflines(tmp_path):
    options = RematOptions(cost_model="in-graph", time_limit=1e-6, cache_dir=tmp_path)
    problem = costed(small_and_big_conv(), options)
    assert problem.profiled is None and problem.cost_model == "analytic"
    assert problem.cost_source.startswith("roofline estimates: measuring in-graph costs would take longer than its "
                                          "share of the time limit")


def test_cached_in_graph_costs_are_scaled_to_whole_runs_timed_now(model, devices, tmp_path, monkeypatch):
    """A cached entry from a loaded moment (every cost ten times what was measured): read back, each device's costs
    keep their shares and are scaled so that with the run's overhead they add up to the whole-model runs timed now
    (the times recorded as the real runs return them; no cost below MIN_SECONDS, which a run faster now than when
    measured can reach), and nothing is measured again or rewritten."""
    groups = GROUPS[:3] + [("flatten_reshape",)] + GROUPS[3:]
    first = profile_costs(*on_ir(model), groups, devices, repeats=3, cache_dir=tmp_path, method="in-graph")
    (entry,) = tmp_path.glob("costs-*.json")
    loaded = dataclasses.replace(first, cost={d: tuple(10 * c for c in v) for d, v in first.cost.items()})
    entry.write_text(json.dumps(loaded.to_json()))
    written = entry.read_text()
    timed: list[float] = []
    whole_seconds = cost_profiled._whole_seconds

    def recorded(*args: Any) -> tuple[float, float]:
        seconds, share = whole_seconds(*args)
        timed.append(seconds)
        return seconds, share

    monkeypatch.setattr(cost_profiled, "_whole_seconds", recorded)
    monkeypatch.setattr(cost_profiled, "_measure", lambda *args: pytest.fail("the cache should have answered"))
    again = profile_costs(*on_ir(model), groups, devices, repeats=3, cache_dir=tmp_path, method="in-graph")
    assert again.from_cache and again.retimed is not None and entry.read_text() == written
    assert len(timed) == len(devices)
    for whole, device in zip(timed, devices, strict=True):
        name = device.name
        scale = again.retimed[name]
        assert scale == pytest.approx(max(whole - again.run_overhead_seconds[name], cost_profiled.MIN_SECONDS)
                                      / sum(loaded.cost[name]))
        assert again.cost[name] == pytest.approx([max(c * scale, cost_profiled.MIN_SECONDS)
                                                  for c in loaded.cost[name]])
    assert again.run_overhead_seconds == first.run_overhead_seconds
    assert set(again.cpu_share) == set(first.cpu_share) == {d.name for d in devices}
    assert all(0 < share <= 1 for share in again.cpu_share.values())


def test_cached_costs_are_served_as_cached_past_the_deadline(model, devices, tmp_path):
    """No time left to re-time cached in-graph costs: they serve as they were cached, not re-timed."""
    first = profile_costs(*on_ir(model), GROUPS, devices[:1], repeats=1, cache_dir=tmp_path, method="in-graph")
    again = profile_costs(*on_ir(model), GROUPS, devices[:1], repeats=1, cache_dir=tmp_path, method="in-graph",
                          deadline=time.perf_counter())
    assert again.from_cache and again.retimed is None and again.cost == first.cost


def test_whole_runs_are_timed_after_the_executors_warm_up(monkeypatch):
    """A whole-model run is timed as `onnx-remat run` times it: runs for WARMUP_SECONDS first, none of them timed,
    then `repeats` timed runs (a fast model), whose interquartile mean is the time and CPU time over it the share (on
    a clock that runs advance by a 64th of a second of wall time, half of it CPU time)."""
    clock = SimpleNamespace(wall=0.0, cpu=0.0)

    def run() -> None:
        clock.wall += 1 / 64
        clock.cpu += 1 / 128

    monkeypatch.setattr(cost_profiled, "time", SimpleNamespace(perf_counter=lambda: clock.wall,
                                                               process_time=lambda: clock.cpu))
    seconds, share = cost_profiled._whole_seconds(run, repeats=7)
    assert clock.wall == (math.ceil(64 * cost_profiled.WARMUP_SECONDS) + 7) / 64  # warm-up runs, then 7 timed
    assert (seconds, share) == (1 / 64, 0.5)


@pytest.mark.parametrize(("values", "middle"), [
    ([3.0], [3.0]),
    ([5.0, 1.0, 2.0], [1.0, 2.0, 5.0]),
    ([9.0, 1.0, 2.0, 2.0], [2.0, 2.0]),
    ([2.0, 15.0, 2.0, 14.0, 2.0, 16.0, 2.0, 50.0], [2.0, 2.0, 14.0, 15.0]),
])
def test_the_interquartile_mean_averages_the_middle_half(values, middle):
    """The mean of the middle half of the sorted values (all of them below 4): a bimodal mix of runs that kept their
    core and runs that waited lands between the two, a stall in the top quarter is dropped."""
    assert cost_profiled.interquartile_mean(values) == pytest.approx(sum(middle) / len(middle))
