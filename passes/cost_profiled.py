"""Measured operator costs: run every operator alone on every device, and time hand-offs between devices.

The paper's cost model (section 4: "computing each operator on each device", then "copy costs between the
devices in both directions"). An operator is a group of node names; it is cut out of the shape-inferred
model as a standalone ONNX model (the tensors it reads from outside become graph inputs, constants stay
initializers, what it produces becomes outputs) and timed on each device's runtime with inputs and outputs
already resident there. A runtime call has a fixed overhead that a real schedule pays once per device
switch, not once per operator: it is measured on a one-element model, taken out of the operator costs and
charged to the copy into that device instead. A whole run on one device pays it once, and moving the graph inputs
in and the outputs back as `onnx-remat run` does: `run_overhead_seconds`, which a single-device prediction adds.

With `method="in-graph"` an operator's cost is instead its share of what its nodes took inside runs of the whole
model on each device (onnxruntime's profiler, OpenVINO's performance counters; the median of IN_GRAPH_RUNS runs,
fewer for a slow model), scaled so that a device's costs add up to the whole model's time there without the
profiler (whose own overhead inflates onnxruntime's small nodes; timed after `onnx-remat run`'s warm-up, whose first
runs are slower, and as the interquartile mean of runs, which load cannot flip: `_whole_seconds`), less the run's
overhead; every node also carries
the runtime's per-node overhead (measured on a chain of NODE_CHAIN one-element nodes). A runtime that fuses across
operators is then costed as it runs whole models, which can differ from the sum of its operators alone either way
(docs/measurements.md). Time the runtime spends in nodes of its own (reorders) goes to the operator whose node or
tensor they serve by name; what cannot be placed goes nowhere, and the scaling spreads it.

Plugging the numbers into the solver: build the Problem as usual, with the device names as the keys of
`device_costs` (any NodeCost, e.g. the analytic one), profile its operators and replace the costs:

    graph = build_problem(model, infos, {d.name: analytic for d in devices}, workspace, groups)
    problem = profile_costs(model, infos, graph.opmap.node_names, devices).apply(graph.problem)

The graph is read on onnx-ir (each group's nodes, what they read from outside and whom their outputs serve, by the
values' producers and uses); the runtimes run protos, serialised once per measurement.

Results are cached as JSON (default `~/.cache/onnx-remat/`), keyed by the graph's structure and shapes
(not its weights), the groups, the devices, the runtime versions and the machine, so a second run measures no
operator. Cached in-graph costs are scaled to whole-model runs timed at use (`retime`): they hold the load of the
moment they were measured (the README's main job: 54 ms cached under load, 29 ms measured on a quiet machine).
An entry that cannot be read or does not fit (truncated, edited, negative or non-finite times) is measured again
and rewritten, with a RematWarning; a cache that cannot be written is a warning too, never a failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import helper, numpy_helper

from onnx_remat.core.devices import Device
from onnx_remat.core.errors import ModelError, RematWarning, one_line
from onnx_remat.core.problem import Problem
from onnx_remat.passes.aliasing import shared_buffers
from onnx_remat.passes.build_problem import constant_values
from onnx_remat.passes.execute import ort_session, random_feeds
from onnx_remat.passes.manager import name_of, named, to_proto
from onnx_remat.passes.run_devices import WARMUP_SECONDS
from onnx_remat.passes.runtimes import Runtime, runtime_for
from onnx_remat.passes.sizes import TensorInfo

MeasureProgress = Callable[[int, int, str], None]

CACHE_VERSION = 4
METHODS = ("profiled", "in-graph")
IN_GRAPH_RUNS = 15
"""Profiled whole-model runs; an operator's share is its median over them: on a loaded machine a run stalls for
10-30 ms inside whichever node was running when a thread lost its core (VGG16's training step: 2-4 of 15 runs per
convolution gradient), which a 20%-trimmed mean kept (a 0.25 ms node costed 8.2 ms, docs/measurements.md). The
median keeps onnxruntime's rounding to whole microseconds a node (a mean would average it out): up to a microsecond a
node moves between operators, their sum is still the whole run's median."""
IN_GRAPH_SECONDS = 1.0
"""About how long the profiled runs may take: fewer than IN_GRAPH_RUNS (MIN_IN_GRAPH_RUNS at least) for a model
slower than that."""
MIN_IN_GRAPH_RUNS = 5
"""Profiled runs of a slow model: a median of 5 outlasts two stalled runs."""
NODE_CHAIN = 100
"""One-element nodes in the chain that measures a runtime's per-node overhead."""
COPY_SIZES = (1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24)
MIN_SECONDS = 1e-7
_SECONDS_PER_MEASUREMENT = 0.5
RETIME_RUNS = 4
"""Whole-model runs that re-timing cached costs takes at least besides WARMUP_SECONDS: the warm-up's last, three
timed."""
FEED_BYTES_FACTOR = 3
"""Bytes drawn per input byte when feeding an operator: float64 random values, then their float32 copy."""


@dataclass(frozen=True)
class ProfiledCosts:
    """Measured seconds per operator on each device, and the cost of moving a tensor between devices.

    - `cost[device][i]`: seconds of operator i on the device, its runtime's per-call overhead taken out.
    - `copy_seconds_per_byte[d][e]`, `copy_fixed_seconds[d][e]`: a tensor of b bytes produced on device d
      is ready as an input on device e after `fixed + per_byte * b` seconds (zero for d == e); the fixed
      part includes a new runtime call on e.
    - `call_overhead_seconds[device]`: the runtime's fixed cost of one call on the device.
    - `run_overhead_seconds[device]`: what a whole-model run on the device costs beyond its operators: the call,
      and moving the graph inputs from the host and the outputs back.
    - `cpu_share[device]` (in-graph costs): the CPU time of the whole-model runs the costs are scaled to over their
      wall time (1 at most; less where they waited for a core), so a prediction can tell the CPU time of a run.
    """

    devices: tuple[str, ...]
    cost: dict[str, tuple[float, ...]]
    copy_seconds_per_byte: tuple[tuple[float, ...], ...]
    copy_fixed_seconds: tuple[tuple[float, ...], ...]
    call_overhead_seconds: dict[str, float]
    run_overhead_seconds: dict[str, float]
    cpu_share: dict[str, float] = dataclasses.field(default_factory=dict)
    from_cache: bool = False
    retimed: dict[str, float] | None = None
    """For cached in-graph costs timed again at use: each device's factor its cached costs were scaled by."""

    def apply(self, problem: Problem) -> Problem:
        """`problem` with these costs and copy costs (fixed and per byte), matched to its devices by name."""
        missing = [d for d in problem.devices if d not in self.cost]
        if missing:
            raise ValueError(f"no profiled costs for device {missing[0]!r} (profiled: {', '.join(self.devices)})")
        if any(len(self.cost[d]) != problem.num_ops for d in problem.devices):
            counts = sorted({len(values) for values in self.cost.values()})
            raise ValueError(f"profiled costs are for {counts[0]} operators, the problem has {problem.num_ops}")
        index = [self.devices.index(d) for d in problem.devices]
        return dataclasses.replace(
            problem,
            cost=tuple(self.cost[d] for d in problem.devices),
            copy_seconds_per_byte=tuple(tuple(self.copy_seconds_per_byte[i][j] for j in index) for i in index),
            copy_fixed_seconds=tuple(tuple(self.copy_fixed_seconds[i][j] for j in index) for i in index),
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the measurements (without the cache flag and the re-timing)."""
        data = dataclasses.asdict(self)
        del data["from_cache"], data["retimed"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], from_cache: bool = False) -> ProfiledCosts:
        """The inverse of `to_json`."""
        return cls(
            devices=tuple(data["devices"]),
            cost={name: tuple(values) for name, values in data["cost"].items()},
            copy_seconds_per_byte=tuple(tuple(row) for row in data["copy_seconds_per_byte"]),
            copy_fixed_seconds=tuple(tuple(row) for row in data["copy_fixed_seconds"]),
            call_overhead_seconds=dict(data["call_overhead_seconds"]),
            run_overhead_seconds=dict(data["run_overhead_seconds"]),
            cpu_share=dict(data["cpu_share"]),
            from_cache=from_cache,
        )


def profile_costs(
    model: ir.Model,
    infos: dict[str, TensorInfo],
    groups: Sequence[Sequence[str]],
    devices: Sequence[Device],
    repeats: int = 50,
    cache_dir: str | Path | None = None,
    progress: MeasureProgress | None = None,
    method: str = "profiled",
    deadline: float | None = None,
) -> ProfiledCosts:
    """Measure every operator (a group of node names of the shape-inferred `model`, whose tensors `infos` gives) on
    every device: each alone (`method` "profiled", as the cost model of that name does), or inside whole-model runs
    ("in-graph"); OutOfTime if the measuring is still under way at `deadline` (a time.perf_counter() value), whose
    part done is not kept. Cached in-graph costs are re-timed (`retime`), or served as cached past `deadline`."""
    if method not in METHODS:
        raise ValueError(f"unknown profiling method {method!r}: use one of {', '.join(METHODS)}")
    operators = [tuple(group) for group in groups]
    devices = tuple(devices)
    key = cache_key(model, infos, operators, devices, repeats, method)
    operator_nodes = members(model, operators)
    refuse_unallocatable(operator_nodes, infos)
    path = Path(cache_dir or default_cache_dir()) / f"costs-{key}.json"
    cached = _read_cache(path, devices, len(operators))
    if cached is not None and method == "in-graph":
        with contextlib.suppress(OutOfTime):
            return retime(cached, model, devices, repeats, progress or _no_progress, deadline)
    if cached is not None:
        return cached
    costs = _measure(model, infos, operator_nodes, devices, repeats, progress or _no_progress, method, deadline)
    _write_cache(path, costs)
    return costs


def members(model: ir.Model, groups: Sequence[Sequence[str]]) -> list[list[ir.Node]]:
    """The nodes of each group, named."""
    nodes = {named(node): node for node in model.graph}
    return [[nodes[name] for name in group] for group in groups]


def refuse_unallocatable(groups: list[list[ir.Node]], infos: dict[str, TensorInfo]) -> None:
    """ModelError if an operator's tensors (its random inputs drawn in float64, its outputs) would not fit in the
    memory this machine has available: measuring it would fail mid-way."""
    needed, name = max(
        (sum(FEED_BYTES_FACTOR * infos[t].nbytes for t in _feeds(group) if t in infos)
         + sum(infos[t].nbytes for t in _buffers(group) if t in infos), named(group[0]))
        for group in groups
    )
    available = available_memory_bytes()
    if available is not None and needed > available:
        raise ModelError(
            f"profiling runs each operator on real tensors, and {name!r} needs {needed / 2**30:.1f} GiB, more than "
            f"the {available / 2**30:.1f} GiB this machine has available: use --cost-model analytic or a smaller "
            "--input-shape"
        )


def _feeds(group: list[ir.Node]) -> set[str]:
    """What the group reads from outside it."""
    inside = {name for node in group for name in map(name_of, node.outputs)}
    return {name for node in group for name in map(name_of, node.inputs) if name and name not in inside}


def _buffers(group: list[ir.Node]) -> set[str]:
    """The group's outputs, one per buffer: a view or an activation written in place shares its input's."""
    owner = shared_buffers(group, set())
    return {owner.get(name, name) for node in group for name in map(name_of, node.outputs) if name}


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), or None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _read_cache(path: Path, devices: tuple[Device, ...], operators: int) -> ProfiledCosts | None:
    """The costs cached at `path`; None when there are none, or (with a warning) when they cannot be used."""
    if not path.exists():
        return None
    try:
        costs = ProfiledCosts.from_json(json.loads(path.read_text()), from_cache=True)
        _check_fits(costs, tuple(d.name for d in devices), operators)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        warnings.warn(f"cost cache entry {path} is unusable ({one_line(exc)}): measuring again", RematWarning,
                      stacklevel=3)
        return None
    return costs


def _check_fits(costs: ProfiledCosts, devices: tuple[str, ...], operators: int) -> None:
    """ValueError unless `costs` covers these devices and operators with finite, non-negative times."""
    overheads = (costs.call_overhead_seconds, costs.run_overhead_seconds)
    if costs.devices != devices or set(costs.cost) != set(devices) or any(set(o) != set(devices) for o in overheads):
        raise ValueError(f"it is for devices {costs.devices}, not {devices}")
    if any(len(values) != operators for values in costs.cost.values()):
        raise ValueError(f"it does not hold {operators} operators per device")
    matrices = (costs.copy_seconds_per_byte, costs.copy_fixed_seconds)
    if any(len(matrix) != len(devices) or any(len(row) != len(devices) for row in matrix) for matrix in matrices):
        raise ValueError("its copy costs are not one per pair of devices")
    times = [*(t for values in costs.cost.values() for t in values), *(t for o in overheads for t in o.values()),
             *(t for matrix in matrices for row in matrix for t in row)]
    if not all(isinstance(t, (int, float)) and math.isfinite(t) and t >= 0 for t in times):
        raise ValueError("it holds a time that is not a finite number of seconds at least 0")
    if not set(costs.cpu_share) <= set(devices) or not all(
            isinstance(s, (int, float)) and 0 < s <= 1 for s in costs.cpu_share.values()):
        raise ValueError("its CPU shares are not of its devices, or not above 0 and at most 1")


def _write_cache(path: Path, costs: ProfiledCosts) -> None:
    """Write `costs` to `path` atomically; a failure (read-only or full disk) is a warning: the costs serve anyway."""
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps(costs.to_json(), indent=1))
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        warnings.warn(f"cannot write the cost cache {path} ({exc.strerror or exc}): costs not cached", RematWarning,
                      stacklevel=3)


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/onnx-remat`, or `~/.cache/onnx-remat`."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "onnx-remat"


def cache_key(
    model: ir.Model, infos: dict[str, TensorInfo], groups: Sequence[tuple[str, ...]], devices: Sequence[Device],
    repeats: int, method: str = "profiled",
) -> str:
    """A hash of what the measurements depend on: graph structure and shapes, groups, devices, runtimes."""
    payload = {
        "version": CACHE_VERSION,
        "runtimes": [ort.__version__, _openvino_version(), platform.machine(), os.cpu_count()],
        "machine": [platform.node(), _processor()],
        "opsets": [[domain, version] for domain, version in model.opset_imports.items()],
        "nodes": [[named(n), n.domain, n.op_type, [name_of(v) for v in n.inputs], [name_of(v) for v in n.outputs],
                   _attribute_digest(n)] for n in model.graph],
        "tensors": sorted([name, list(info.shape), info.elem_type] for name, info in infos.items()),
        "groups": groups,
        "devices": [[d.name, d.runtime, d.provider, d.threads] for d in devices],
        "repeats": repeats,
        "method": method,
    }
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:24]


def _openvino_version() -> str:
    """OpenVINO's version as its package states it, read without importing it (0.15-0.2 s a CPU-only run skips)."""
    return importlib.metadata.version("openvino")


def _processor() -> str:
    """The CPU's model name (Linux), else what the platform module says: costs differ between processors."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor()


def _attribute_digest(node: ir.Node) -> str:
    attributes = (ir.serde.serialize_attribute(a).SerializeToString() for a in node.attributes.values())
    return hashlib.sha256(b"".join(attributes)).hexdigest()


def _no_progress(done: int, total: int, label: str) -> None:
    """The default progress callback: report nothing."""


def _measure(
    model: ir.Model, infos: dict[str, TensorInfo], groups: list[list[ir.Node]], devices: tuple[Device, ...],
    repeats: int, progress: MeasureProgress, method: str, deadline: float | None,
) -> ProfiledCosts:
    """Run the measurements: call overheads, every operator on every device, every hand-off."""
    proto = to_proto(model)  # what the runtimes run
    runtimes = [runtime_for(d) for d in devices]
    empty = {runtime.device.name: _empty_call(runtime) for runtime in runtimes}
    overhead = {name: _median_seconds(call, max(repeats, 50)) for name, call in empty.items()}
    feeds = random_feeds(proto, seed=0)
    run_overhead = {runtime.device.name: overhead[runtime.device.name]
                    + _moves_seconds(runtime, proto, infos, feeds, repeats) for runtime in runtimes}
    per_device = len(groups) if method == "profiled" else 2
    steps = _Steps(len(devices) * (per_device + len(devices)), progress, deadline)
    cpu_share: dict[str, float] = {}
    if method == "profiled":
        cost = _operator_costs(_Cutter(model, proto, infos, groups), groups, runtimes, empty, repeats, steps)
    else:
        cost = {}
        for runtime in runtimes:
            name = runtime.device.name
            cost[name], cpu_share[name] = _in_graph_costs(proto, groups, runtime, empty[name], run_overhead[name],
                                                          repeats, steps)
    per_byte, fixed = _copy_matrices(runtimes, overhead, repeats, steps)
    steps.finish()
    return ProfiledCosts(
        devices=tuple(d.name for d in devices),
        cost=cost,
        copy_seconds_per_byte=per_byte,
        copy_fixed_seconds=fixed,
        call_overhead_seconds=overhead,
        run_overhead_seconds=run_overhead,
        cpu_share=cpu_share,
    )


def retime(
    costs: ProfiledCosts, model: ir.Model, devices: tuple[Device, ...], repeats: int, progress: MeasureProgress,
    deadline: float | None = None,
) -> ProfiledCosts:
    """`costs` (in-graph) with each device's operator costs scaled so that they add up, with the run's overhead, to
    the median of whole-model runs timed now, as measuring them did, with those runs' CPU share: the operators'
    shares and the overheads are kept, the load of the moment they were measured is not. OutOfTime if the runs would
    pass `deadline`."""
    proto = to_proto(model)
    feeds = random_feeds(proto, seed=0)
    steps = _Steps(len(devices), progress, deadline)
    scales: dict[str, float] = {}
    shares: dict[str, float] = {}
    for device in devices:
        name, overhead = device.name, costs.run_overhead_seconds[device.name]
        cached = sum(costs.cost[name])
        steps.step(f"whole model on {name}", needs=WARMUP_SECONDS + RETIME_RUNS * (cached + overhead))
        whole, shares[name] = _whole_seconds(_whole_run(runtime_for(device), proto, feeds), repeats)
        scales[name] = max(whole - overhead, MIN_SECONDS) / cached
    steps.finish()
    cost = {name: tuple(max(c * scales[name], MIN_SECONDS) for c in values) for name, values in costs.cost.items()}
    return dataclasses.replace(costs, cost=cost, cpu_share=shares, retimed=scales)


class OutOfTime(Exception):
    """Measuring was still under way at its deadline."""


@dataclass
class _Steps:
    """Counts measurements and reports them to a progress callback; none starts past the deadline."""

    total: int
    progress: MeasureProgress
    deadline: float | None = None
    done: int = 0

    def step(self, label: str, timed: bool = True, needs: float = 0.0) -> None:
        """Announce the next measurement, or raise OutOfTime if it is `timed` (not free: a device's copy to itself)
        and the deadline has passed, or will before the `needs` seconds it takes at least."""
        if timed and self.deadline is not None and time.perf_counter() + needs >= self.deadline:
            raise OutOfTime(f"{self.done} of {self.total} measurements were done by the deadline")
        self.progress(self.done, self.total, label)
        self.done += 1

    def finish(self) -> None:
        self.progress(self.total, self.total, "done")


def _operator_costs(
    cutter: _Cutter, groups: list[list[ir.Node]], runtimes: list[Runtime],
    empty: dict[str, Callable[[], object]], repeats: int, steps: _Steps,
) -> dict[str, tuple[float, ...]]:
    """Seconds of every group on every device, less an empty call on the device (at least MIN_SECONDS)."""
    cost: dict[str, list[float]] = {runtime.device.name: [] for runtime in runtimes}
    for group in groups:
        submodel, feeds = cutter.cut(group)
        for runtime in runtimes:
            name = runtime.device.name
            steps.step(f"{named(group[0])} on {name}")
            seconds = _median_seconds(runtime.prepare(submodel, feeds), repeats, empty[name])
            cost[name].append(max(seconds, MIN_SECONDS))
    return {name: tuple(values) for name, values in cost.items()}


def _in_graph_costs(
    model: onnx.ModelProto, groups: list[list[ir.Node]], runtime: Runtime, empty: Callable[[], object],
    run_overhead: float, repeats: int, steps: _Steps,
) -> tuple[tuple[float, ...], float]:
    """Seconds of every group's nodes inside whole-model runs on the runtime's device: its nodes' per-node overhead
    and its share of the rest of a run, the run's overhead taken out (see the module docstring); and the CPU share of
    those runs."""
    steps.step(f"whole model on {runtime.device.name}")
    owner = {name: g for g, group in enumerate(groups) for node in group
             for name in (named(node), *(value.name for value in node.outputs if value.name))}
    feeds = random_feeds(model, seed=0)
    whole, cpu_share = _whole_seconds(_whole_run(runtime, model, feeds), repeats)
    count = min(IN_GRAPH_RUNS, max(MIN_IN_GRAPH_RUNS, int(IN_GRAPH_SECONDS / whole)))
    steps.step(f"{count} profiled runs on {runtime.device.name}", needs=count * whole)
    runs = runtime.node_seconds(model, feeds, count)
    per_run = np.zeros((len(runs), len(groups)))
    for r, timed in enumerate(runs):
        for name, seconds in timed.items():
            if (group := _owner(name, owner)) is not None:
                per_run[r, group] += seconds
    shares = np.median(per_run, axis=0)
    per_node = _median_seconds(_node_chain(runtime), repeats, empty) / NODE_CHAIN
    counts = np.array([len(group) for group in groups])
    rest = max(whole - run_overhead - per_node * counts.sum(), 0.0)
    scale = rest / shares.sum() if shares.sum() > 0 else 0.0
    costs = tuple(max(float(per_node * count + seconds * scale), MIN_SECONDS)
                  for count, seconds in zip(counts, shares, strict=True))
    return costs, cpu_share


def _owner(name: str, owner: dict[str, int]) -> int | None:
    """The group of a node name the runtime reports: an ONNX node or tensor name, or the longest such name it starts
    with followed by a separator (OpenVINO names a reorder it adds after the tensor it reorders)."""
    if name in owner:
        return owner[name]
    for end in range(len(name) - 1, 0, -1):
        if name[end] in "_/.:" and name[:end] in owner:
            return owner[name[:end]]
    return None


def _copy_matrices(
    runtimes: list[Runtime], overhead: dict[str, float], repeats: int, steps: _Steps
) -> tuple[tuple[tuple[float, ...], ...], tuple[tuple[float, ...], ...]]:
    """Per-byte and fixed seconds of every hand-off; the fixed part includes the target's call overhead."""
    per_byte, fixed = [], []
    for source in runtimes:
        fits = []
        for target in runtimes:
            steps.step(f"copies {source.device.name} -> {target.device.name}", timed=source is not target)
            fits.append((0.0, 0.0) if source is target else _copy_fit(source, target, repeats))
        per_byte.append(tuple(b for _, b in fits))
        fixed.append(tuple(
            0.0 if source is target else a + overhead[target.device.name]
            for (a, _), target in zip(fits, runtimes, strict=True)
        ))
    return tuple(per_byte), tuple(fixed)


def _median_seconds(run: Callable[[], object], repeats: int, baseline: Callable[[], object] | None = None) -> float:
    """Median wall time of `run` after two warm-up calls, less that of `baseline` timed right after each run
    (paired, so a change in machine load cancels out); stops early past half a second (3 runs at least)."""
    run(), run()
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < repeats and (len(samples) < 3 or time.perf_counter() - started < _SECONDS_PER_MEASUREMENT):
        samples.append(_seconds(run) - (_seconds(baseline) if baseline else 0.0))
    return statistics.median(samples)


def _whole_seconds(run: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Wall time of a whole-model run as `onnx-remat run` times it, after its warm-up (WARMUP_SECONDS: a session's
    first runs are slower, its first 50 runs 4% slower than 50 after 0.5 s on mobilenet_v3_small), and the CPU
    time of this process over the runs as a share of it (1 at most: a runtime's threads may spin while they wait for
    work): interquartile means (`interquartile_mean`) of `repeats` runs at most, as many as _SECONDS_PER_MEASUREMENT
    holds (3 at least)."""
    began = time.perf_counter()
    run()
    while time.perf_counter() - began < WARMUP_SECONDS:
        run()
    wall: list[float] = []
    cpu: list[float] = []
    started = time.perf_counter()
    while len(wall) < repeats and (len(wall) < 3 or time.perf_counter() - started < _SECONDS_PER_MEASUREMENT):
        processor, clock = time.process_time(), time.perf_counter()
        run()
        wall.append(time.perf_counter() - clock)
        cpu.append(time.process_time() - processor)
    whole = interquartile_mean(wall)
    return whole, min(1.0, interquartile_mean(cpu) / whole)


def interquartile_mean(values: Sequence[float]) -> float:
    """The mean of the middle half of `values` (all of them below 4): under load a run either keeps its core or waits
    for other processes' time slices, and the median of such a mix jumps between the two as the share of waiting runs
    passes one half (mobilenet_v3_small's inference, 20-run windows at load average 6: medians 1.9-15 ms, means
    6.4-11.3 ms), while this follows that share and still drops a few stalled runs."""
    ordered = sorted(values)
    cut = len(ordered) // 4
    return statistics.fmean(ordered[cut:len(ordered) - cut])


def _seconds(run: Callable[[], object]) -> float:
    begin = time.perf_counter()
    run()
    return time.perf_counter() - begin


def _empty_call(runtime: Runtime) -> Callable[[], object]:
    """A runtime call that does next to nothing (a Relu of one element): the runtime's per-call overhead."""
    return _relu_chain(runtime, 1)


def _node_chain(runtime: Runtime) -> Callable[[], object]:
    """A call of NODE_CHAIN one-element Relus in a row: less an empty call, NODE_CHAIN times the per-node overhead."""
    return _relu_chain(runtime, NODE_CHAIN + 1)


def _relu_chain(runtime: Runtime, length: int) -> Callable[[], object]:
    """A runtime call of `length` one-element Relus, each reading the one before."""
    names = [f"t{k}" for k in range(length + 1)]
    nodes = [helper.make_node("Relu", [names[k]], [names[k + 1]], name=f"relu{k}") for k in range(length)]
    value = helper.make_tensor_value_info(names[0], onnx.TensorProto.FLOAT, [1])
    result = helper.make_tensor_value_info(names[-1], onnx.TensorProto.FLOAT, [1])
    graph = helper.make_graph(nodes, "overhead", [value], [result])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return runtime.prepare(model, {names[0]: np.ones(1, np.float32)})


def _whole_run(runtime: Runtime, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> Callable[[], object]:
    """A whole-model run as `onnx-remat run` times it: the inputs moved from the host, the call, the outputs back."""
    run = runtime.compile(model)
    return lambda: [runtime.to_host(value) for value in run(
        {name: runtime.from_host(array) for name, array in feeds.items()}).values()]


def _moves_seconds(runtime: Runtime, model: onnx.ModelProto, infos: dict[str, TensorInfo],
                   feeds: dict[str, np.ndarray], repeats: int) -> float:
    """Median seconds of moving the graph inputs onto the device and values shaped as its outputs back to the host
    (without running the model, which may not fit in memory where its operators alone do)."""
    shapes = [infos[output.name] for output in model.graph.output]
    outputs = [runtime.from_host(np.zeros(i.shape, helper.tensor_dtype_to_np_dtype(i.elem_type))) for i in shapes]
    return _median_seconds(lambda: ([runtime.from_host(array) for array in feeds.values()],
                                    [runtime.to_host(value) for value in outputs]), repeats)


def _copy_fit(source: Runtime, target: Runtime, repeats: int) -> tuple[float, float]:
    """Fixed seconds and seconds per byte (both >= 0) of handing a float tensor from `source` to `target`."""

    def round_trip(value: Any) -> Callable[[], object]:
        return lambda: target.from_host(source.to_host(value))

    seconds = []
    for size in COPY_SIZES:
        seconds.append(_median_seconds(round_trip(source.from_host(np.ones(size // 4, np.float32))), repeats))
    # Weighted by 1/seconds: relative errors count, so the small sizes pin down the fixed part.
    per_byte, fixed = np.polyfit(np.array(COPY_SIZES, float), np.array(seconds), 1, w=1 / np.array(seconds))
    return max(float(fixed), 0.0), max(float(per_byte), 0.0)


class _Cutter:
    """Cuts node groups out of a model (on onnx-ir, and as the proto the runtimes run) as standalone models, with
    inputs to run them on."""

    def __init__(self, model: ir.Model, proto: onnx.ModelProto, infos: dict[str, TensorInfo],
                 groups: list[list[ir.Node]]):
        self.proto = proto
        self.infos = infos
        self.inputs = set(model.graph.inputs)
        self.constants = constant_values(model.graph)
        self.values = self._fixed_values(groups)

    def cut(self, group: list[ir.Node]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        """The group's nodes as a model, and values for its inputs (real where they matter, else random)."""
        reads = _reads(group)
        inputs = [value for value in reads if value not in self.constants]
        graph = helper.make_graph(
            [ir.serde.serialize_node(node) for node in group], f"operator {named(group[0])}",
            [self._value_info(value) for value in inputs], [self._value_info(value) for value in _outputs(group)],
            [self._constant(value) for value in reads if value in self.constants],
        )
        model = helper.make_model(
            graph, opset_imports=self.proto.opset_import, ir_version=self.proto.ir_version,
            functions=self.proto.functions,
        )
        feeds = random_feeds(model)
        feeds.update({value.name: self.values[value.name] for value in inputs if value.name in self.values})
        return model, feeds

    def _constant(self, value: ir.Value) -> onnx.TensorProto:
        """An initializer, or a tensor computed from constants alone, as an initializer."""
        if value.is_initializer() and value.const_value is not None:
            return ir.serde.serialize_tensor(value.const_value)
        return numpy_helper.from_array(self.values[named(value)], named(value))

    def _value_info(self, value: ir.Value) -> onnx.ValueInfoProto:
        info = self.infos[named(value)]
        return helper.make_tensor_value_info(named(value), info.elem_type, info.shape)

    def _fixed_values(self, groups: list[list[ir.Node]]) -> dict[str, np.ndarray]:
        """Real values of the read tensors random data would break: computed constants and non-float activations
        (shapes, indices), from one run of the whole model on random inputs."""
        read = dict.fromkeys(value for group in groups for value in _reads(group))
        needed = [
            named(value) for value in read
            if not value.is_initializer() and value not in self.inputs
            and (value in self.constants or not _is_float(self.infos[named(value)]))
        ]
        if not needed:
            return {}
        model = onnx.ModelProto()
        model.CopyFrom(self.proto)
        del model.graph.output[:]
        model.graph.output.extend(helper.make_tensor_value_info(name, self.infos[name].elem_type,
                                                                self.infos[name].shape) for name in needed)
        return dict(zip(needed, ort_session(model).run(needed, random_feeds(model)), strict=True))


def _reads(nodes: list[ir.Node]) -> list[ir.Value]:
    """The values `nodes` read from outside themselves, in first-use order."""
    inside = set(nodes)
    return list(dict.fromkeys(value for node in nodes for value in node.inputs
                              if value is not None and value.producer() not in inside))


def _outputs(nodes: list[ir.Node]) -> list[ir.Value]:
    """What a group produces for others, the graph, or nobody (so no runtime prunes its nodes)."""
    inside = set(nodes)
    return [value for node in nodes for value in node.outputs if value.name and (
        value.is_graph_output() or not value.uses() or any(use.node not in inside for use in value.uses()))]


def _is_float(info: TensorInfo) -> bool:
    return bool(np.issubdtype(helper.tensor_dtype_to_np_dtype(info.elem_type), np.floating))
