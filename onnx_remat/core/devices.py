"""Devices to place operators on: which runtime runs them, on what hardware, with how many threads.

A device file is TOML with one `[[device]]` table per device, in the order the solver numbers them:

    [[device]]
    name = "cpu"                        # used in --budget cpu=2GiB and in the rewritten model's tags
    runtime = "onnxruntime"             # or "openvino"
    provider = "CPUExecutionProvider"   # onnxruntime execution provider, or OpenVINO device (CPU, GPU, GPU.1)
    threads = 4                         # optional: intra-op threads (onnxruntime) / INFERENCE_NUM_THREADS
    budget = "2GiB"                     # optional: memory budget, as --budget reads it

`PRESETS` names common settings; `get_devices` takes a preset name or a file path. `device_budgets` merges the
budgets of the command line (or the Python API) with those of the device file.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnx_remat.core.budget import Budget, parse_budget
from onnx_remat.core.errors import UsageError

RUNTIMES = ("onnxruntime", "openvino")
DEFAULT_PROVIDERS = {"onnxruntime": "CPUExecutionProvider", "openvino": "CPU"}
_KEYS = {"name", "runtime", "provider", "threads", "budget"}


@dataclass(frozen=True)
class Device:
    """One device: a runtime, the provider (onnxruntime) or device string (OpenVINO) it runs on,
    an optional thread limit and an optional budget as the user wrote it."""

    name: str
    runtime: str
    provider: str
    threads: int | None = None
    budget: str | None = None

    @property
    def parsed_budget(self) -> Budget | None:
        """The device's budget parsed, or None when the device file gives none."""
        return None if self.budget is None else parse_budget(self.budget)


PRESETS: dict[str, tuple[Device, ...]] = {
    "cpu": (Device("cpu", "onnxruntime", "CPUExecutionProvider"),),
    "cpu+cuda": (
        Device("cpu", "onnxruntime", "CPUExecutionProvider"),
        Device("gpu", "onnxruntime", "CUDAExecutionProvider"),
    ),
    "cpu+openvino-gpu": (
        Device("cpu", "onnxruntime", "CPUExecutionProvider"),
        Device("gpu", "openvino", "GPU"),
    ),
    "ort-cpu+ov-cpu": (
        Device("ort-cpu", "onnxruntime", "CPUExecutionProvider", threads=1),
        Device("ov-cpu", "openvino", "CPU", threads=1),
    ),
}


def preset(name: str) -> tuple[Device, ...]:
    """The devices of a named preset, checked to be present on this machine."""
    if name not in PRESETS:
        raise UsageError(f"unknown device preset {name!r}: use one of {', '.join(PRESETS)} or a .toml file")
    devices = PRESETS[name]
    for device in devices:
        check_available(device, f"preset {name!r}")
    return devices


def get_devices(spec: str | Path | Sequence[Device] | None = None) -> tuple[Device, ...]:
    """Devices from a preset name or a TOML file path; given Devices are checked; None is the `cpu` preset."""
    if spec is None:
        return preset("cpu")
    if isinstance(spec, (str, Path)):
        return preset(str(spec)) if str(spec) in PRESETS else load_devices(spec)
    devices = tuple(spec)
    if not devices:
        raise UsageError("no devices given: give at least one Device, a device file or a preset")
    _check_unique(devices, "devices")
    for device in devices:
        check_available(device, "devices")
    return devices


def load_devices(path: str | Path) -> tuple[Device, ...]:
    """Read and check a device file: known runtimes, unique names, providers present on this machine."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"device file {path} does not exist: give a .toml file or a preset ({', '.join(PRESETS)})")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"device file {path} is not valid TOML: {exc}") from None
    tables = data.get("device")
    if not isinstance(tables, list) or not tables:
        raise UsageError(f"device file {path} lists no devices: add one [[device]] table per device")
    devices = tuple(_device(table, f"{path}, device {k + 1}") for k, table in enumerate(tables))
    _check_unique(devices, str(path))
    for device in devices:
        check_available(device, str(path))
    return devices


def _device(table: Any, where: str) -> Device:
    """One [[device]] table turned into a Device, with its fields checked."""
    if not isinstance(table, dict):
        raise UsageError(f"{where}: each device must be a [[device]] table")
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r}: a device has {', '.join(sorted(_KEYS))}")
    name, runtime = table.get("name"), table.get("runtime")
    if not isinstance(name, str) or not name or any(c in name for c in "=, "):
        raise UsageError(f"{where}: give a name without '=', ',' or spaces (e.g. name = \"cpu\")")
    if runtime not in RUNTIMES:
        raise UsageError(f"{where} ({name}): unknown runtime {runtime!r}: use {' or '.join(RUNTIMES)}")
    provider = table.get("provider", DEFAULT_PROVIDERS[runtime])
    threads, budget = table.get("threads"), table.get("budget")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise UsageError(f"{where} ({name}): threads must be a positive integer, not {threads!r}")
    if budget is not None:
        try:
            parse_budget(str(budget))
        except UsageError as exc:
            raise UsageError(f"{where} ({name}): {exc}") from None
    return Device(name, runtime, str(provider), threads, None if budget is None else str(budget))


def _check_unique(devices: Iterable[Device], where: str) -> None:
    """Device names must differ: budgets and placements refer to devices by name."""
    seen: set[str] = set()
    for device in devices:
        if device.name in seen:
            raise UsageError(f"{where}: device name {device.name!r} appears twice: give each device its own name")
        seen.add(device.name)


def check_available(device: Device, where: str) -> None:
    """Raise a UsageError naming what is present when the device's provider is missing here."""
    if device.runtime == "onnxruntime":
        available = _onnxruntime_providers()
        present = device.provider in available
    else:
        available = _openvino_devices()
        present = any(d == device.provider or d.split(".")[0] == device.provider for d in available)
    if not present:
        raise UsageError(
            f"{where}: device {device.name!r} needs {device.runtime} {device.provider}, which this machine "
            f"does not have (available: {', '.join(available) or 'none'})"
        )


@functools.cache
def _onnxruntime_providers() -> tuple[str, ...]:
    import onnxruntime

    return tuple(onnxruntime.get_available_providers())


@functools.cache
def _openvino_devices() -> tuple[str, ...]:
    import openvino

    return tuple(openvino.Core().available_devices)


def parse_device_budgets(text: str, names: Iterable[str] | None = None) -> dict[str, Budget]:
    """Parse `cpu=2GiB,gpu=512MiB`; given the device `names`, a bare budget (`25%`) applies to each."""
    known = None if names is None else tuple(names)
    if "=" not in text and known is not None:
        budget = parse_budget(text)
        return dict.fromkeys(known, budget)
    budgets: dict[str, Budget] = {}
    for item in text.split(","):
        name, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not name:
            raise UsageError(f"cannot read device budget {item.strip()!r} in {text!r}: write name=budget (cpu=2GiB)")
        if name in budgets:
            raise UsageError(f"device {name!r} has two budgets in {text!r}")
        if known is not None and name not in known:
            raise UsageError(f"--budget names device {name!r}, but the devices are {', '.join(known)}")
        budgets[name] = parse_budget(value)
    return budgets


def budgets_by_name(devices: Iterable[Device], override: Mapping[str, Budget] | None = None) -> dict[str, Budget]:
    """Each device's budget: from `override` (the command line) if given there, else from its device file."""
    override = override or {}
    budgets = {}
    for d in devices:
        budget = override.get(d.name, d.parsed_budget)
        if budget is not None:
            budgets[d.name] = budget
    return budgets


BudgetSpec = str | int | Budget | Mapping[str, str | int | Budget]
"""A budget for every device (`25%`, bytes, a Budget), per device as text (`cpu=2GiB,gpu=25%`) or as a mapping."""


def device_budgets(devices: Sequence[Device], budget: BudgetSpec | None) -> dict[str, Budget]:
    """Every device's budget, in device order: from `budget` where it names one, else from the device file.

    A device left without a budget is an error that says how to give one."""
    names = [d.name for d in devices]
    if budget is None:
        override: dict[str, Budget] = {}
    elif isinstance(budget, str):
        override = parse_device_budgets(budget, names)
    elif isinstance(budget, Mapping):
        override = {name: _as_budget(value) for name, value in budget.items()}
        unknown = [name for name in override if name not in names]
        if unknown:
            raise UsageError(f"the budgets name device {unknown[0]!r}, but the devices are {', '.join(names)}")
    else:
        override = dict.fromkeys(names, _as_budget(budget))
    budgets = budgets_by_name(devices, override)
    missing = [name for name in names if name not in budgets]
    if missing:
        raise UsageError(
            f"device {missing[0]!r} has no budget: give --budget {missing[0]}=2GiB (or 25%, min), "
            "one budget for every device, or budget = in the device file"
        )
    return {name: budgets[name] for name in names}


def _as_budget(value: str | int | Budget) -> Budget:
    """A budget given as text, bytes or a Budget."""
    if isinstance(value, Budget):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise UsageError(f"budget {value} must be more than zero bytes")
        return Budget(absolute_bytes=value)
    return parse_budget(str(value))
