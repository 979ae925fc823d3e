"""Shared fixtures: small ONNX graphs built with onnx.helper, written to temporary files."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_remat.core.budget import Budget
from onnx_remat.core.devices import Device
from onnx_remat.core.options import COST_MODEL_VARIABLE
from onnx_remat.core.problem import Problem
from onnx_remat.passes.autodiff import TrainingGraph, build_training_graph
from onnx_remat.passes.manager import to_proto
from onnx_remat.passes.solve.baselines import on_device
from onnx_remat.passes.solve.min_budget import minimum_budget
from onnx_remat.pipeline import PreparedModel
from onnx_remat.resolve import Minima, resolve_budgets

# Tests that do not ask for a cost model get the roofline (commands run in child processes too): fast, and the same
# costs on every run, so schedules do not change with the machine's load. tests/test_default_costs.py unsets it.
os.environ[COST_MODEL_VARIABLE] = "analytic"

CPU_TWO_THREADS = (Device("cpu", "onnxruntime", "CPUExecutionProvider", threads=2),)
"""The `cpu` preset with its intra-op threads pinned: what a session keeps (a worker thread's stack,
passes/runtime_kept.py) depends on them, and unpinned they are the machine's physical cores, so a fixed budget of a
tiny model would be feasible on one machine and not on another."""


def conv_chain(depth: int = 6, channels: int = 8, size: int = 16, batch: int | str = 1) -> onnx.ModelProto:
    """Conv+Relu blocks in a chain: no skip, so keep-all order frees as it goes."""
    rng = np.random.default_rng(0)
    nodes, inits, current = [], [], "input"
    for k in range(depth):
        weight = (rng.standard_normal((channels, channels, 3, 3)) * (2 / (9 * channels)) ** 0.5).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, f"w{k}"))
        nodes.append(helper.make_node("Conv", [current, f"w{k}"], [f"c{k}"], name=f"conv{k}", pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{k}"], [f"r{k}"], name=f"relu{k}"))
        current = f"r{k}"
    nodes[-1].output[0] = "output"
    shape = [batch, channels, size, size]
    graph = helper.make_graph(
        nodes, "conv_chain",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, shape)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def skip_net(depth: int = 4, channels: int = 4, size: int = 16) -> onnx.ModelProto:
    """A U-Net-like graph: an encoder chain whose outputs are all added back in the decoder."""
    rng = np.random.default_rng(1)
    nodes, inits, current, skips = [], [], "input", []
    for k in range(depth):
        w = rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.2
        inits.append(numpy_helper.from_array(w, f"ew{k}"))
        nodes.append(helper.make_node("Conv", [current, f"ew{k}"], [f"e{k}"], name=f"enc{k}", pads=[1, 1, 1, 1]))
        current = f"e{k}"
        skips.append(current)
    for k, skip in enumerate(reversed(skips)):
        nodes.append(helper.make_node("Tanh", [current], [f"t{k}"], name=f"dec{k}"))
        nodes.append(helper.make_node("Add", [f"t{k}", skip], [f"d{k}"], name=f"add{k}"))
        current = f"d{k}"
    nodes[-1].output[0] = "output"
    shape = [1, channels, size, size]
    graph = helper.make_graph(
        nodes, "skip_net",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, shape)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.fixture
def chain_path(tmp_path):
    path = tmp_path / "chain.onnx"
    onnx.save(conv_chain(), path)
    return path


@pytest.fixture
def skip_path(tmp_path):
    path = tmp_path / "skip.onnx"
    onnx.save(skip_net(), path)
    return path


PROOF_SECONDS = 600.0
"""Time for minima the tests rely on being proven: seconds on a quiet machine, far more than a loaded one needs."""


def step_as_proto(model: onnx.ModelProto, **options: Any) -> TrainingGraph:
    """The training step of `model` (build_training_graph on it read into onnx-ir), its model serialised to the
    ModelProto onnxruntime, OpenVINO and the checker take."""
    step = build_training_graph(ir.serde.deserialize_model(model), **options)
    return replace(step, model=to_proto(step.model))


def whole_gradient_groups(prepared: PreparedModel) -> PreparedModel:
    """`prepared` with each node's gradient one operator again, its parts split by what they hand on merged: the
    mixed-only tests need an operator as large as a whole convolution gradient, which neither device alone can run
    within budgets a mixed schedule meets (with the parts apart, a conv chain has none)."""
    groups: list[tuple[str, ...]] = []
    roles: list[str] = []
    for group, role in zip(prepared.groups or [], prepared.roles, strict=True):
        gradient_of = group[0].split(".grad/")[0] + ".grad/" if ".grad/" in group[0] else None
        if gradient_of and groups and groups[-1][0].startswith(gradient_of):
            groups[-1] += group
        else:
            groups.append(group)
            roles.append(role)
    return replace(prepared, groups=groups, roles=tuple(roles))


def mixed_only_budgets(problem: Problem) -> tuple[Problem, list[int]]:
    """`problem` (two devices) with budgets below what each device needs alone: the first at 98% of its
    single-device minimum, the second halfway between its minimum then and its single-device minimum; and those
    single-device minima."""
    alone = [minimum_budget(on_device(problem, d), time_limit=PROOF_SECONDS).feasible for d in range(2)]
    first = Budget(absolute_bytes=int(0.98 * alone[0]))
    minima = resolve_budgets(Minima(problem), [first, Budget(minimum=True)], True, PROOF_SECONDS).minima
    assert minima[1].feasible < alone[1]
    second = Budget(absolute_bytes=(minima[1].feasible + alone[1]) // 2)
    mixed = resolve_budgets(Minima(problem), [first, second], True, PROOF_SECONDS).budgets
    return replace(problem, budgets=mixed), alone
