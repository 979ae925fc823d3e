"""Draw a schedule like the XEngine paper: R and S matrices per device (Fig. 4), memory over time (Fig. 5).

`schedule_matrices` derives the paper's R (computed in stage t) and S (held entering stage t) from the
event sequence; `plot_schedule` draws them with each device's memory trace below and writes a PNG or SVG.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from onnx_remat.core.errors import OutputError, UsageError
from onnx_remat.core.files import write_atomically
from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute, Schedule
from onnx_remat.passes.simulate import simulate
from onnx_remat.sweep import Sweep, SweepPoint

_T = TypeVar("_T")

_FORMATS = {".png": "png", ".svg": "svg"}
_MIB = 2**20
_COMPUTE_COLORS = ListedColormap(["white", "black", "tab:red"])
_KEEP_COLORS = ListedColormap(["white", "tab:blue"])
_DEVICE_COLORS = ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:brown", "tab:olive")


def schedule_matrices(problem: Problem, schedule: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """R[d, t, i]: op i computed in stage t on device d; S[d, t, i]: its output held on d entering stage t."""
    m = schedule.matrices(problem.num_ops, problem.num_devices)
    return m.computed, m.held[:, : problem.num_ops]


def _compute_codes(schedule: Schedule, compute: np.ndarray) -> np.ndarray:
    """R as colour codes: 0 idle, 1 first computation of the operator, 2 recomputation."""
    codes = compute.astype(np.int8) * 2
    seen: set[int] = set()
    for event in schedule.computes:
        if event.op not in seen:
            seen.add(event.op)
            codes[event.device, event.stage, event.op] = 1
    return codes


def _draw_matrix(ax: Axes, image: np.ndarray, cmap: ListedColormap, title: str, forward_count: int | None) -> None:
    """One stage x operator matrix, with the forward/backward split as dashed lines."""
    ax.imshow(image, cmap=cmap, vmin=0, vmax=cmap.N - 1, interpolation="nearest", aspect="equal")
    ax.set_title(title)
    ax.set_xlabel("operator")
    ax.set_ylabel("stage")
    if forward_count is not None:
        for line in (ax.axvline, ax.axhline):
            line(forward_count - 0.5, color="tab:green", linestyle="--", linewidth=1)


def memory_traces(problem: Problem, schedule: Schedule) -> list[np.ndarray]:
    """Per device, MiB held before the first event (its resident bytes and the loaded groups its computations read)
    and after each event (from the simulator)."""
    traces = simulate(problem, schedule).memory_trace
    residents = [problem.resident_with(d, schedule.computed_on(d)) for d in range(problem.num_devices)]
    return [np.array((resident, *trace)) / _MIB for resident, trace in zip(residents, traces, strict=True)]


def running_memory(problem: Problem, schedule: Schedule, traces: list[np.ndarray]) -> list[np.ndarray]:
    """Per device and event, MiB held while that event's operator runs there (the held memory, its output and
    its workspace; the simulator's peak), NaN where the device runs nothing: the spikes above the trace."""
    peaks = [np.full(len(trace), np.nan) for trace in traces]
    for index, event in enumerate(schedule.events):
        if isinstance(event, Compute):
            extra = problem.output_bytes[event.op] + problem.workspace_bytes[event.op]
            peaks[event.device][index + 1] = traces[event.device][index] + extra / _MIB
    return peaks


def _draw_memory(
    ax: Axes, trace: np.ndarray, running: np.ndarray, budget: int, keep_all: int, color: str, split: int | None
) -> None:
    """One device's memory over the events, the spikes while operators run, and budget and keep-all lines."""
    events = np.arange(len(trace))
    ran = ~np.isnan(running)
    ax.vlines(
        events[ran],
        trace[ran],
        running[ran],
        color=color,
        alpha=0.6,
        linewidth=0.8,
        label="while an operator runs (+ output, workspace)",
    )
    ax.step(events, trace, where="post", color=color, label="held after each event")
    highest = np.fmax(running, trace)
    top = int(np.argmax(highest))
    ax.plot(top, highest[top], "v", color="black", label=f"peak {highest[top]:.2f} MiB")
    ax.axhline(budget / _MIB, color="black", linestyle="--", linewidth=1, label=f"budget {budget / _MIB:.1f} MiB")
    ax.axhline(keep_all / _MIB, color="tab:orange", linestyle=":", label=f"keep-all {keep_all / _MIB:.1f} MiB")
    if split is not None:
        ax.axvline(split, color="tab:green", linestyle="--", linewidth=1, label="forward | backward")
    ax.set_xlabel("event")
    ax.set_ylabel("memory (MiB)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")


def _backward_start(schedule: Schedule, forward_count: int | None) -> int | None:
    """Index in the memory trace where the first backward stage begins."""
    if forward_count is None:
        return None
    return next((i for i, e in enumerate(schedule.events) if e.stage >= forward_count), len(schedule.events))


def _keep_all_per_device(problem: Problem, keep_all_bytes: int | Sequence[int] | None) -> list[int]:
    """Keep-all bytes for each device: given per device, one value for all, or the problem's default."""
    if keep_all_bytes is None:
        return [problem.keep_all_bytes(d) for d in range(problem.num_devices)]
    if isinstance(keep_all_bytes, int):
        return [keep_all_bytes] * problem.num_devices
    if len(keep_all_bytes) != problem.num_devices:
        raise UsageError(f"keep_all_bytes has {len(keep_all_bytes)} entries for {problem.num_devices} devices")
    return list(keep_all_bytes)


def _build_figure(
    problem: Problem,
    schedule: Schedule,
    keep_all: list[int],
    forward_count: int | None,
    title: str | None,
) -> Figure:
    """One block per device, stacked: R and S side by side, that device's memory across both below."""
    devices = problem.num_devices
    fig = Figure(figsize=(12, 9 * devices), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2 * devices, 2, height_ratios=(2.2, 1) * devices)
    compute, keep = schedule_matrices(problem, schedule)
    codes = _compute_codes(schedule, compute)
    split = _backward_start(schedule, forward_count)
    traces = memory_traces(problem, schedule)
    running = running_memory(problem, schedule, traces)
    memory_axes: list[Axes] = []
    for d, name in enumerate(problem.devices):
        color = _DEVICE_COLORS[d % len(_DEVICE_COLORS)]
        r_ax, s_ax = fig.add_subplot(grid[2 * d, 0]), fig.add_subplot(grid[2 * d, 1])
        _draw_matrix(r_ax, codes[d], _COMPUTE_COLORS, f"R{d}: computed on {name}", forward_count)
        _draw_matrix(s_ax, keep[d].astype(np.int8), _KEEP_COLORS, f"S{d}: held on {name} entering stage", forward_count)
        r_ax.legend(
            handles=[Patch(color="black", label="first"), Patch(color="tab:red", label="recompute")],
            loc="upper right",
            fontsize="small",
        )
        mem_ax = fig.add_subplot(grid[2 * d + 1, :], sharey=memory_axes[0] if memory_axes else None)
        memory_axes.append(mem_ax)
        _draw_memory(mem_ax, traces[d], running[d], problem.budgets[d], keep_all[d], color, split)
        mem_ax.set_title(f"memory on {name}")
    if title:
        fig.suptitle(title)
    return fig


def plot_schedule(
    problem: Problem,
    schedule: Schedule,
    path: str | os.PathLike[str],
    keep_all_bytes: int | Sequence[int] | None = None,
    forward_count: int | None = None,
    title: str | None = None,
) -> None:
    """Write R/S matrices and memory per device to a .png or .svg atomically; ScheduleError if invalid."""
    target = _checked_target(path)
    write_atomically(target, render_schedule(problem, schedule, target.suffix, keep_all_bytes, forward_count, title))


def render_schedule(
    problem: Problem,
    schedule: Schedule,
    suffix: str,
    keep_all_bytes: int | Sequence[int] | None = None,
    forward_count: int | None = None,
    title: str | None = None,
) -> bytes:
    """The R/S matrices and memory per device as the bytes of a .png or .svg (by `suffix`); ScheduleError if
    invalid."""
    fig = _build_figure(problem, schedule, _keep_all_per_device(problem, keep_all_bytes), forward_count, title)
    return _rendered(fig, suffix)


def _checked_target(path: str | os.PathLike[str]) -> Path:
    """The plot path, refused unless it ends in .png or .svg and its directory exists."""
    target = Path(path)
    if target.suffix.lower() not in _FORMATS:
        raise UsageError(f"plot path {target} must end in .png or .svg")
    if not target.parent.is_dir():
        raise OutputError(f"cannot write plot {target}: directory {target.parent} does not exist")
    return target


def _rendered(fig: Figure, suffix: str) -> bytes:
    """`fig` in the format the suffix names."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=_FORMATS[suffix.lower()], dpi=120)
    return buffer.getvalue()


def plot_sweep(sweep: Sweep, path: str | os.PathLike[str]) -> None:
    """Write predicted (and measured) time and peak against budget, knee and minimum marked, as .png or .svg."""
    target = _checked_target(path)
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    time_ax, peak_ax = fig.subplots(1, 2)
    feasible = [p for p in sweep.points if p.feasible]
    budgets = np.array([_known(p.budget_bytes, "budget_bytes", p) for p in feasible]) / _MIB
    predicted = [1e3 * _known(p.predicted_seconds, "predicted_seconds", p) for p in feasible]
    time_ax.plot(budgets, predicted, "o-", color="tab:blue", label="predicted")
    measured_seconds = _all_known([p.measured_seconds for p in feasible])
    if feasible and measured_seconds is not None:
        time_ax.plot(budgets, [1e3 * t for t in measured_seconds], "s--", color="tab:green", label="measured")
    if feasible:
        keep_all = _known(feasible[0].keep_all_seconds, "keep_all_seconds", feasible[0])
        time_ax.axhline(1e3 * keep_all, color="tab:orange", linestyle=":", label="keep-all")
    if sweep.knee is not None:
        knee = sweep.points[sweep.knee]
        knee_mib = _known(knee.budget_bytes, "budget_bytes", knee) / _MIB
        time_ax.plot(
            knee_mib,
            1e3 * _known(knee.predicted_seconds, "predicted_seconds", knee),
            "*",
            markersize=18,
            color="tab:red",
            label=f"knee: {knee_mib:.2f} MiB, {100 * _known(knee.overhead, 'overhead', knee):+.1f}% "
            f"(smallest within {100 * sweep.knee_overhead:g}%)",
        )
    _mark_infeasible(time_ax, sweep)
    time_ax.set_xlabel("budget (MiB)")
    time_ax.set_ylabel("time per run (ms)")
    time_ax.set_ylim(bottom=0)
    time_ax.set_title("time against budget")
    peaks = [_known(p.predicted_peak_bytes, "predicted_peak_bytes", p) / _MIB for p in feasible]
    peak_ax.plot(budgets, peaks, "o-", color="tab:blue", label="predicted peak")
    measured_activations = _all_known([p.measured_activation_bytes for p in feasible])
    if feasible and measured_activations is not None:
        measured = [(activations + _known(p.resident_bytes, "resident_bytes", p)) / _MIB
                    for activations, p in zip(measured_activations, feasible, strict=True)]
        peak_ax.plot(budgets, measured, "s--", color="tab:green", label="measured activations + resident")
    peak_ax.plot(budgets, budgets, ":", color="black", label="budget")
    _mark_infeasible(peak_ax, sweep)
    peak_ax.set_xlabel("budget (MiB)")
    peak_ax.set_ylabel("memory (MiB)")
    peak_ax.set_ylim(bottom=0)
    peak_ax.set_title("peak memory against budget")
    for ax in (time_ax, peak_ax):
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    fig.suptitle(f"{sweep.model} ({sweep.mode})")
    write_atomically(target, _rendered(fig, target.suffix))


def _known(value: _T | None, field: str, point: SweepPoint) -> _T:
    """A field every feasible sweep point (and the knee) has; a clear error if it is missing."""
    if value is None:
        raise ValueError(f"sweep point {point.label!r} has no {field}")
    return value


def _all_known(values: list[_T | None]) -> list[_T] | None:
    """The values if none is missing (a measurement taken at every point), else None."""
    known = [v for v in values if v is not None]
    return known if len(known) == len(values) else None


def _mark_infeasible(ax: Axes, sweep: Sweep) -> None:
    """Infeasible budgets as crosses on the axis and the minimum feasible budget as a vertical line."""
    refused = [p.budget_bytes for p in sweep.points if not p.feasible and p.budget_bytes is not None]
    if refused:
        ax.plot(
            [budget / _MIB for budget in refused],
            [0] * len(refused),
            "x",
            color="tab:red",
            markersize=10,
            clip_on=False,
            label="infeasible",
        )
    minimum = next((p.minimum_bytes for p in sweep.points if p.minimum_bytes), None)
    if minimum:
        ax.axvline(
            minimum / _MIB, color="tab:red", linestyle="--", linewidth=1, label=f"minimum {minimum / _MIB:.2f} MiB"
        )
