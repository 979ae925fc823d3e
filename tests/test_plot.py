"""Schedule plots: R/S matrices derived from events, and valid PNG/SVG files written atomically."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from onnx_remat.core.errors import OutputError, UsageError
from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute, Copy, Free, Schedule
from onnx_remat.passes.simulate import simulate
from onnx_remat.plot import memory_traces, plot_schedule, running_memory, schedule_matrices

MIB = 2**20


def training_chain() -> tuple[Problem, Schedule]:
    """Forward 0 -> 1, backward 2 -> 3 reading 0 again; 0 is freed early and recomputed in stage 3."""
    problem = Problem(
        op_names=("f0", "f1", "b1", "b0"),
        edges=((0, 1), (1, 2), (2, 3), (0, 3)),
        output_bytes=(1 * MIB, 2 * MIB, 2 * MIB, 1 * MIB),
        cost=((1.0, 1.0, 1.0, 1.0),),
        resident_bytes=(MIB,),
        budgets=(5 * MIB,),
        graph_outputs=(3,),
    )
    schedule = Schedule(
        (
            Compute(0, 0),
            Compute(1, 1),
            Free(0, 1),
            Compute(2, 2),
            Free(1, 2),
            Compute(0, 3),
            Compute(3, 3),
            Free(0, 3),
            Free(2, 3),
        )
    )
    return problem, schedule


def two_devices() -> tuple[Problem, Schedule]:
    """Chain 0 -> 1 -> 2: 0 on the CPU, copied to the GPU for 1 and 2; the result is copied back."""
    problem = Problem(
        op_names=("a", "b", "c"),
        edges=((0, 1), (1, 2)),
        output_bytes=(MIB, MIB, MIB),
        cost=((1.0, 1.0, 1.0), (0.5, 0.5, 0.5)),
        resident_bytes=(0, MIB),
        budgets=(4 * MIB, 4 * MIB),
        graph_outputs=(2,),
        devices=("cpu", "gpu"),
        copy_seconds_per_byte=((0.0, 1e-9), (1e-9, 0.0)),
    )
    schedule = Schedule(
        (
            Compute(0, 0, device=0),
            Copy(0, 1, source=0, target=1),
            Free(0, 1, device=0),
            Compute(1, 1, device=1),
            Free(0, 1, device=1),
            Compute(2, 2, device=1),
            Free(1, 2, device=1),
            Copy(2, 2, source=1, target=0),
        )
    )
    return problem, schedule


def cells(*coordinates: tuple[int, int, int], shape: tuple[int, int, int]) -> np.ndarray:
    """A bool array of `shape`, true exactly at `coordinates`."""
    matrix = np.zeros(shape, dtype=bool)
    for coordinate in coordinates:
        matrix[coordinate] = True
    return matrix


def test_matrices_chain_with_recomputation() -> None:
    problem, schedule = training_chain()
    compute, keep = schedule_matrices(problem, schedule)
    assert compute.dtype == bool and keep.dtype == bool
    shape = (1, 4, 4)
    np.testing.assert_array_equal(compute, cells((0, 0, 0), (0, 1, 1), (0, 2, 2), (0, 3, 0), (0, 3, 3), shape=shape))
    np.testing.assert_array_equal(keep, cells((0, 1, 0), (0, 2, 1), (0, 3, 2), shape=shape))


def test_matrices_two_devices_with_copy() -> None:
    problem, schedule = two_devices()
    compute, keep = schedule_matrices(problem, schedule)
    shape = (2, 3, 3)
    np.testing.assert_array_equal(compute, cells((0, 0, 0), (1, 1, 1), (1, 2, 2), shape=shape))
    np.testing.assert_array_equal(keep, cells((0, 1, 0), (1, 2, 1), shape=shape))


def test_keep_carries_over_stages_without_events() -> None:
    problem, _ = training_chain()
    schedule = Schedule((Compute(0, 0), Compute(1, 2), Compute(2, 2), Compute(3, 3)))
    _, keep = schedule_matrices(problem, schedule)
    np.testing.assert_array_equal(keep[0, :, 0], [False, True, True, True])
    np.testing.assert_array_equal(keep[0, 3], [True, True, True, False])


@pytest.mark.parametrize("case", [training_chain, two_devices])
def test_png_written_and_readable(tmp_path: Path, case) -> None:
    problem, schedule = case()
    path = tmp_path / "schedule.png"
    plot_schedule(problem, schedule, path, forward_count=2, title="test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert sorted(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize("case", [training_chain, two_devices])
def test_svg_written_and_parses(tmp_path: Path, case) -> None:
    problem, schedule = case()
    path = tmp_path / "schedule.svg"
    plot_schedule(problem, schedule, path, keep_all_bytes=8 * MIB)
    assert ET.parse(path).getroot().tag.endswith("svg")
    assert sorted(tmp_path.iterdir()) == [path]


def test_existing_file_is_replaced(tmp_path: Path) -> None:
    problem, schedule = training_chain()
    path = tmp_path / "schedule.png"
    path.write_bytes(b"old")
    plot_schedule(problem, schedule, str(path))
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert sorted(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize("name", ["schedule.jpg", "schedule", "schedule.png.txt"])
def test_bad_suffix_is_a_usage_error(tmp_path: Path, name: str) -> None:
    problem, schedule = training_chain()
    with pytest.raises(UsageError, match=r"\.png or \.svg"):
        plot_schedule(problem, schedule, tmp_path / name)
    assert list(tmp_path.iterdir()) == []


def test_missing_directory_is_an_output_error(tmp_path: Path) -> None:
    problem, schedule = training_chain()
    with pytest.raises(OutputError):
        plot_schedule(problem, schedule, tmp_path / "missing" / "schedule.png")


def test_keep_all_per_device_must_match_device_count(tmp_path: Path) -> None:
    problem, schedule = two_devices()
    with pytest.raises(UsageError, match="keep_all_bytes"):
        plot_schedule(problem, schedule, tmp_path / "schedule.png", keep_all_bytes=(MIB,))
    assert list(tmp_path.iterdir()) == []


def test_running_memory_reaches_the_simulated_peak_with_workspace() -> None:
    """The memory panel's spikes (output and workspace while an operator runs) reach the simulator's peak,
    which the held-after-each-event trace alone does not."""
    problem, schedule = training_chain()
    problem = replace(problem, workspace_bytes=(0, 3 * MIB, 0, 0), budgets=(9 * MIB,))
    traces = memory_traces(problem, schedule)
    running = running_memory(problem, schedule, traces)
    peak = simulate(problem, schedule).peak_bytes[0] / MIB
    assert np.nanmax(running[0]) == pytest.approx(peak)
    assert traces[0].max() < peak


def test_multi_device_png_stacks_one_block_per_device(tmp_path: Path) -> None:
    problem, schedule = two_devices()
    one, two = tmp_path / "one.png", tmp_path / "two.png"
    plot_schedule(*training_chain(), one)
    plot_schedule(problem, schedule, two)
    assert matplotlib.image.imread(two).shape[0] > 1.8 * matplotlib.image.imread(one).shape[0]
