"""Problem files: a round trip keeps every field, and each kind of bad file is refused with a clear ModelError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnx_remat.core.errors import ModelError
from onnx_remat.core.problem import Loaded, NodeSteps, Problem
from onnx_remat.problem_file import problem_to_json, read_problem, write_problem


@st.composite
def problems(draw) -> Problem:
    n = draw(st.integers(0, 8))
    devices = draw(st.integers(1, 3))
    edges = sorted({(u, v) for v in range(1, n) for u in draw(st.sets(st.integers(0, v - 1), max_size=2))})
    seconds = st.floats(0.0, 1e3, allow_nan=False)
    return Problem(
        op_names=tuple(f"op{i}" for i in range(n)),
        edges=tuple(edges),
        output_bytes=tuple(draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n))),
        cost=tuple(tuple(draw(st.lists(seconds, min_size=n, max_size=n))) for _ in range(devices)),
        resident_bytes=tuple(draw(st.lists(st.integers(0, 2**40), min_size=devices, max_size=devices))),
        budgets=tuple(draw(st.lists(st.integers(0, 2**40), min_size=devices, max_size=devices))),
        graph_outputs=tuple(sorted(draw(st.sets(st.integers(0, n - 1), max_size=n)))) if n else (),
        devices=tuple(f"dev{d}" for d in range(devices)),
        workspace_bytes=tuple(draw(st.lists(st.integers(0, 2**20), min_size=n, max_size=n))),
        copy_seconds_per_byte=tuple(tuple(draw(st.lists(seconds, min_size=devices, max_size=devices)))
                                    for _ in range(devices)),
        copy_fixed_seconds=tuple(tuple(draw(st.lists(seconds, min_size=devices, max_size=devices)))
                                 for _ in range(devices)),
        loaded=tuple(Loaded(tuple(draw(st.lists(st.integers(0, 2**40), min_size=devices, max_size=devices))),
                            tuple(sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n)))))
                     for _ in range(draw(st.integers(0, 2 if n else 0)))),
        node_steps=tuple(draw(node_steps(v, edges)) for v in range(n)) if draw(st.booleans()) else (),
    )  # fmt: skip


@st.composite
def node_steps(draw, op: int, edges: list[tuple[int, int]]) -> NodeSteps:
    sizes = tuple(draw(st.lists(st.integers(0, 2**30), max_size=4)))
    inputs = sorted(u for u, v in edges if v == op)
    reads = tuple((u, draw(st.integers(0, len(sizes) - 1))) for u in inputs if sizes and draw(st.booleans()))
    return NodeSteps(sizes, reads)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problems())
def test_round_trip_keeps_every_field(tmp_path: Path, problem: Problem):
    path = tmp_path / "problem.json"
    write_problem(problem, path)
    assert read_problem(path) == problem


def small() -> dict:
    problem = Problem(
        op_names=("a", "b", "c"),
        edges=((0, 1), (1, 2)),
        output_bytes=(10, 20, 30),
        cost=((1.0, 2.0, 3.0), (2.0, 4.0, 6.0)),
        resident_bytes=(5, 5),
        budgets=(100, 200),
        graph_outputs=(2,),
        devices=("gpu", "cpu"),
        workspace_bytes=(0, 1, 0),
        copy_seconds_per_byte=((0.0, 0.5), (0.5, 0.0)),
    )
    return problem_to_json(problem)


def broken(change) -> dict:
    data = small()
    change(data)
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (broken(lambda d: d.pop("edges")), "lacks 'edges'"),
        (broken(lambda d: d.update(extra=1)), "unknown keys 'extra'"),
        (broken(lambda d: d.update(format="other")), "format"),
        (broken(lambda d: d.update(version=2)), "version 2 is not supported"),
        (broken(lambda d: d.update(devices=[])), "give at least one device"),
        (broken(lambda d: d["devices"][1].update(name="gpu")), "repeat"),
        (broken(lambda d: d["devices"][0].update(budget_bytes=-1)), r"devices\[0\].budget_bytes"),
        (broken(lambda d: d["devices"][0].update(resident_bytes=1.5)), "whole number of bytes"),
        (broken(lambda d: d["operators"][1].update(seconds=[1.0])), r"operators\[1\].seconds must be a list of 2"),
        (broken(lambda d: d["operators"][1]["seconds"].__setitem__(0, -1)), "seconds >= 0"),
        (broken(lambda d: d["operators"][2].pop("workspace_bytes")), "lacks 'workspace_bytes'"),
        (broken(lambda d: d.update(edges=[[1, 0]])), "topological order"),
        (broken(lambda d: d.update(edges=[[0, 7]])), r"edges\[0\] must be an operator index in 0..2"),
        (broken(lambda d: d.update(graph_outputs=[True])), "operator index"),
        (broken(lambda d: d.update(copy_seconds_per_byte=[[0.0]])), "2 x 2"),
        (broken(lambda d: d.pop("copy_fixed_seconds")), "lacks 'copy_fixed_seconds'"),
        (broken(lambda d: d.update(loaded=5)), "'loaded' must be a JSON list"),
        (broken(lambda d: d.update(loaded=[{"bytes": [1, 2], "readers": []}])), r"loaded\[0\].readers is empty"),
        (broken(lambda d: d.update(loaded=[{"bytes": [1], "readers": [0]}])), r"loaded\[0\].bytes must be a list of 2"),
        (broken(lambda d: d["operators"][1].update(node_steps={"bytes": [1, 2], "last_reads": [[2, 0]]})),
         r"operators\[1\].node_steps.last_reads\[0\] must be \[input operator, node\]"),
        (broken(lambda d: d["operators"][1].update(node_steps={"bytes": [1]})), "lacks 'last_reads'"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_bad_files_are_refused_naming_the_field(tmp_path: Path, data, message: str):
    path = tmp_path / "problem.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ModelError, match=message):
        read_problem(path)


def test_missing_and_non_json_files(tmp_path: Path):
    with pytest.raises(ModelError, match="does not exist"):
        read_problem(tmp_path / "absent.json")
    path = tmp_path / "problem.json"
    path.write_text("{not json")
    with pytest.raises(ModelError, match="is not JSON"):
        read_problem(path)
    assert ModelError.exit_code == 3
