"""Run a rewritten model on the devices it was placed on: the Python side of `onnx-remat run`.

    run = onnx_remat.run_on_devices("out.onnx", "devices/ort-cpu+ov-cpu.toml")
    run.outputs, run.seconds, run.predicted_peak_bytes, run.measured_peak_bytes, run.verdicts, run.within_budgets
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from onnx_remat.core.budget import Budget
from onnx_remat.core.devices import Device, budgets_by_name, get_devices, parse_device_budgets
from onnx_remat.core.errors import ModelError, UsageError
from onnx_remat.core.options import DEFAULT_MEMORY_PROCESSES, DEFAULT_REPEATS
from onnx_remat.core.tags import read_budgets
from onnx_remat.passes import load
from onnx_remat.passes.execute import random_feeds
from onnx_remat.passes.measure_devices import with_measured_peaks
from onnx_remat.passes.run_devices import DeviceRun, build_plan, execute


def run_on_devices(
    model: str | Path | onnx.ModelProto,
    devices: str | Path | Sequence[Device] | None = None,
    feeds: dict[str, np.ndarray] | None = None,
    budget: str | None = None,
    repeats: int = DEFAULT_REPEATS,
    measure_memory: bool = True,
    memory_processes: int = DEFAULT_MEMORY_PROCESSES,
) -> DeviceRun:
    """Execute a model written by onnx-remat on `devices` (a preset, a device file or Devices): each device's
    segments on its runtime, tensors handed across at the copy nodes; outputs, measured time, predicted peaks and,
    with `measure_memory`, measured peaks (a fresh process runs the model again: `passes/measure_devices.py`; up to
    `memory_processes` in all when the first lands near a budget or over it), which `verdicts` and `within_budgets`
    then go by: a device is over its budget only when every process measured it over (`passes/verdict.py`).

    `feeds`: the graph inputs (default: reproducible random values). `budget`: bytes to compare each device's peak
    with, for all (`2GiB`) or per device (`cpu=2GiB,gpu=512MiB`); a device not named there is compared with the
    budget the model was rewritten for, else with its device file's budget in bytes (a percentage is of the
    original model's keep-all, which the rewritten model cannot tell), else with none.
    """
    if repeats < 1:
        raise UsageError(f"repeats must be at least 1, not {repeats}")
    if memory_processes < 1:
        raise UsageError(f"memory processes must be at least 1, not {memory_processes}: 1 trusts one process")
    model = load.load_model(model)
    devices = get_devices(devices)
    feeds = input_values(model, feeds)
    plan = build_plan(model, devices)
    run = execute(plan, feeds, repeats, _budgets(model, devices, budget))
    return with_measured_peaks(run, plan, feeds, memory_processes) if measure_memory else run


def input_values(model: onnx.ModelProto, feeds: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """The given feeds, checked to be exactly the graph inputs, or random ones."""
    initializers = {init.name for init in model.graph.initializer}
    names = [value.name for value in model.graph.input if value.name not in initializers]
    if feeds is None:
        try:
            return random_feeds(model, seed=0)
        except ValueError as exc:
            raise ModelError(f"{exc}: give the inputs") from None
    if missing := [name for name in names if name not in feeds]:
        raise UsageError(f"no value for input {missing[0]!r}: the model's inputs are {', '.join(names)}")
    if unknown := [name for name in feeds if name not in names]:
        raise UsageError(f"the model has no input {unknown[0]!r}: its inputs are {', '.join(names)}")
    return {name: np.asarray(feeds[name]) for name in names}


def _budgets(model: onnx.ModelProto, devices: tuple[Device, ...], budget: str | None) -> dict[str, int]:
    """Each device's budget in bytes: given, else recorded in the model, else from the device file (bytes only)."""
    names = [device.name for device in devices]
    given = parse_device_budgets(budget, names) if budget else {}
    for name, value in given.items():
        if value.absolute_bytes is None:
            raise UsageError(
                f"budget {value} for {name} is not in bytes: a run compares peaks with bytes (2GiB, 512MiB); "
                "a percentage or min needs the original model"
            )
    recorded = {name: Budget(absolute_bytes=value) for name, value in read_budgets(model).items()}
    merged = {**budgets_by_name(devices), **recorded, **given}
    return {name: b.absolute_bytes for name, b in merged.items() if name in names and b.absolute_bytes is not None}
