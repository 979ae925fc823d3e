"""The problem's memory model against the node-level liveness the executor sees, on grouped training graphs.

The solver simulates a schedule on the problem (a group's exported outputs held from its computation to their
Free, its internal tensors and scratch as workspace); onnxruntime runs the rewritten graph node by node
(`predicted_activation_peak`). The problem must never predict less, or a schedule within budget runs over it.
"""

from __future__ import annotations

import onnx
import pytest

from onnx_remat.core.devices import get_devices
from onnx_remat.models import FIXTURES, build
from onnx_remat.passes.measure import held_before_run, predicted_activation_peak
from onnx_remat.passes.rewrite import rewrite
from onnx_remat.passes.runtime_kept import kept_per_session
from onnx_remat.passes.simulate import simulate
from onnx_remat.passes.sizes import tensor_infos
from onnx_remat.passes.solve.baselines import chen_segments, chen_sqrt_n, frontier_only, keep_all, prune_unread
from onnx_remat.pipeline import costed_problem, prepare

MODELS = {
    "vgg16": lambda: build("vgg16", batch=1, resolution=32),
    "resnet18_small": lambda: onnx.load(str(FIXTURES / "resnet18_small.onnx")),
}
SCHEDULES = {
    "keep-all": keep_all,
    "chen-sqrt-n": chen_sqrt_n,
    "segments-3": lambda problem: chen_segments(problem, 3),
    "frontier-only": frontier_only,
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def grouped(request):
    prepared = prepare(MODELS[request.param](), "train")
    graph = costed_problem(prepared, get_devices(None))
    assert prepared.groups and any(len(group) > 1 for group in prepared.groups)
    return request.param, prepared, graph


def peaks(prepared, graph, schedule) -> tuple[int, int]:
    """The schedule's activation peak as the problem simulates it (without what is resident: parameters, inputs and
    what the session keeps) and as the rewritten graph runs node by node, pruned of unread computations as the solver
    hands every schedule out."""
    problem = graph.problem
    schedule = prune_unread(problem, schedule)
    model = rewrite(prepared.model, graph.opmap, schedule, problem.devices)
    device, infos = get_devices(None)[0], tensor_infos(prepared.model)
    resident = held_before_run(model) + kept_per_session(device, prepared.model.graph, infos)
    return simulate(problem, schedule).peak_bytes[0] - resident, predicted_activation_peak(model)


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_problem_peak_bounds_the_node_level_peak(grouped, schedule):
    """Every baseline's simulated peak bounds the rewritten graph's node by node; VGG16's Chen schedule did not before
    the rewrite released unread outputs (a recomputed MaxPool's values read by nobody were held to the end)."""
    _, prepared, graph = grouped
    simulated, node_level = peaks(prepared, graph, SCHEDULES[schedule](graph.problem))
    assert simulated >= node_level
    assert simulated <= 1.5 * node_level


def test_keep_all_peak_is_close_to_the_node_level_peak(grouped):
    _, prepared, graph = grouped
    simulated, node_level = peaks(prepared, graph, keep_all(graph.problem))
    assert node_level <= simulated <= 1.03 * node_level


def test_recomputed_groups_leave_no_unread_tensors_behind(grouped):
    """A conv gradient recomputed for its input gradient must not also compute its weight gradient, which nobody
    would read and onnxruntime would hold to the end of the run (14x the problem's peak on VGG16 frontier-only)."""
    _, prepared, graph = grouped
    schedule = prune_unread(graph.problem, frontier_only(graph.problem))
    model = rewrite(prepared.model, graph.opmap, schedule, graph.problem.devices)
    read = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    source = prepared.proto.graph
    originally_read = {name for node in source.node for name in node.input} | {o.name for o in source.output}
    by_step: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        by_step.setdefault(step_of(node), []).append(node)
    partly_dead = [
        node.name for nodes in by_step.values() if any(is_read(node, read) for node in nodes)
        for node in nodes
        if not is_read(node, read) and all(name.split("__remat")[0] in originally_read for name in node.output if name)
    ]
    assert partly_dead == []


def step_of(node: onnx.NodeProto) -> str:
    return next(p.value for p in node.metadata_props if p.key == "onnx_remat.step")


def is_read(node: onnx.NodeProto, read: set[str]) -> bool:
    return any(name in read for name in node.output if name)
