"""The simulator: exact memory figures for hand-made schedules, and one rejection per error kind."""

from __future__ import annotations

from dataclasses import replace

import pytest

from onnx_remat.core.errors import ScheduleError
from onnx_remat.core.problem import NodeSteps, Problem
from onnx_remat.core.schedule import Compute, Copy, Free, Schedule
from onnx_remat.passes.simulate import check_schedule, simulate


def chain3(budget: int = 10_000, devices: tuple[str, ...] = ("cpu",)) -> Problem:
    """a -> b -> c with sizes 100, 200, 300, b needing 50 bytes of workspace, 1000 bytes resident."""
    d = len(devices)
    return Problem(
        op_names=("a", "b", "c"),
        edges=((0, 1), (1, 2)),
        output_bytes=(100, 200, 300),
        cost=((1.0, 2.0, 3.0),) * d,
        resident_bytes=(1000,) * d,
        budgets=(budget,) * d,
        graph_outputs=(2,),
        devices=devices,
        workspace_bytes=(0, 50, 0),
        copy_seconds_per_byte=((0.0, 0.01), (0.02, 0.0)) if d == 2 else ((0.0,),),
    )


def run(*events) -> Schedule:
    return Schedule(tuple(events))


GOOD = run(Compute(0, 0), Compute(1, 1), Free(0, 1), Compute(2, 2), Free(1, 2))


def test_exact_memory_and_cost():
    simulation = simulate(chain3(), GOOD)
    assert simulation.memory_trace == ((1100, 1300, 1200, 1500, 1300),)
    assert simulation.peak_bytes == (1500,)
    assert simulation.compute_cost == 6.0 and simulation.copy_cost == 0.0 and simulation.total_cost == 6.0


def test_workspace_counts_only_while_running():
    """b runs with a, b and 50 bytes of workspace (1350), then holds 1300; c peaks at 1600 without frees."""
    simulation = simulate(chain3(), run(Compute(0, 0), Compute(1, 1), Compute(2, 2)))
    assert simulation.peak_bytes == (1600,)
    assert simulation.memory_trace[0][:2] == (1100, 1300)


def test_an_input_freed_after_an_operator_is_held_until_its_last_reading_node():
    """b's two nodes: the first reads a (100 bytes) and holds 150 of its own, the second 250 (its output and 50 of
    workspace). Freed after b, a dies after b's first node, so replayed as `run` b's step peaks at 1250; the solvers'
    model holds a to b's end (1350); where c reads a after b, a lives on and b's step holds all of it."""
    steps = (NodeSteps(), NodeSteps((150, 250), ((0, 0),)), NodeSteps())
    problem = replace(chain3(), output_bytes=(100, 200, 1), node_steps=steps)
    assert simulate(problem, GOOD, as_run=True).peak_bytes == (1250,)
    assert simulate(problem, GOOD).peak_bytes == (1350,)
    c_reads_a = replace(problem, edges=((0, 1), (0, 2), (1, 2)))
    late = run(Compute(0, 0), Compute(1, 1), Compute(2, 2), Free(0, 2), Free(1, 2))
    assert simulate(c_reads_a, late, as_run=True).peak_bytes == (1350,)


def test_recomputation_after_free():
    schedule = run(Compute(0, 0), Free(0, 0), Compute(0, 1), Compute(1, 1), Free(0, 1), Compute(2, 2), Free(1, 2))
    simulation = simulate(chain3(), schedule)
    assert simulation.compute_cost == 7.0
    assert simulation.peak_bytes == (1500,)


def test_copy_between_devices():
    schedule = run(Compute(0, 0, 0), Copy(0, 1, 0, 1), Free(0, 1, 0), Compute(1, 1, 1), Compute(2, 2, 1))
    simulation = simulate(chain3(devices=("cpu", "gpu")), schedule)
    assert simulation.peak_bytes == (1100, 1600)
    assert simulation.copy_cost == pytest.approx(100 * 0.01)
    assert simulation.memory_trace == ((1100, 1100, 1000, 1000, 1000), (1000, 1100, 1100, 1300, 1600))


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ((Compute(1, 0),), "needs input 0 (a), which is not held there"),
        ((Compute(0, 0), Compute(0, 0)), "while its output is already held there"),
        ((Compute(0, 0), Free(1, 0)), "where its output is not held"),
        ((Compute(0, 0), Compute(1, 1), Compute(2, 2), Free(2, 2)), "graph output 2 (c) is not held"),
        ((Compute(0, 0), Compute(1, 1), Compute(2, 2), Compute(5, 2)), "operator 5 is not in 0..2"),
        ((Compute(0, 0, 3),), "device out of range"),
        ((Compute(0, 1), Compute(1, 0)), "stage 0 is not in 1..2"),
        ((Compute(0, 3),), "stage 3 is not in 0..2"),
        (("compute a",), "is not a Compute, Free or Copy"),
    ],
)
def test_rejects(events, message):
    with pytest.raises(ScheduleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        simulate(chain3(), run(*events))


def test_rejects_an_operator_never_computed():
    problem = Problem(("a", "b"), (), (1, 1), ((1.0, 1.0),), (0,), (10,), (0,))
    with pytest.raises(ScheduleError, match=r"operator 1 \(b\) is never computed"):
        simulate(problem, run(Compute(0, 0)))


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ((Copy(0, 0, 0, 1),), "copying operator 0 (a) from device 0, where its output is not held"),
        ((Compute(0, 0, 0), Compute(0, 0, 1), Copy(0, 0, 0, 1)), "to device 1, where its output is already held"),
    ],
)
def test_rejects_bad_copies(events, message):
    with pytest.raises(ScheduleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        simulate(chain3(devices=("cpu", "gpu")), run(*events))


def test_check_schedule_enforces_the_budget():
    assert check_schedule(chain3(budget=1500), GOOD).peak_bytes == (1500,)
    with pytest.raises(ScheduleError, match="peaks at 1500 bytes, above its budget of 1499 bytes"):
        check_schedule(chain3(budget=1499), GOOD)
