"""Execute a rewritten multi-device model: per-device segments, each on its device's runtime, tensors handed
across at the copy nodes.

The nodes (in file order, the schedule's order) are split into maximal runs of nodes tagged with one device
(`onnx_remat.device`); each run becomes a standalone ONNX model (inputs: what it reads from outside; outputs: what
a later step or the graph reads, and what nobody reads, so that no runtime prunes a node) compiled on its device's
runtime (`runtimes`). A copy node (`onnx_remat.role` = copy) is not run by a runtime: the executor moves its input
from the source device to the target through host memory. A copy ends the open segment if it goes into the
segment's device or is the last reader of its input (which is then freed where the schedule frees it); any other
copy waits for the segment's end. The executor holds a segment's inputs until it returns, where the schedule frees
each after its last reader: a segment also ends after the last reader of an input where holding the inputs read for
the last time would take its device above the schedule's peak. Graph inputs and the prelude's outputs are
held on every device that reads them, moved there before its first segment reading them. The executor drops its
reference to a value after the last step that reads it.

Time is measured: whole runs after warm-up runs, median over the repeats; per device the time inside its segments,
the rest (`handoff_seconds`) is moving tensors and Python. Memory is predicted here and measured by
`measure_devices` (fresh processes, the high-water mark reset around every step: `with_measured_peaks`), and judged
against the budgets within the spread of those processes (`verdict`).
A Constant node's value is an initializer of every segment reading it, as runtimes hold it
(`sizes.held_as_initializer`): never handed over, so that a runtime needing it constant (OpenVINO: a ReduceSum's
axes) finds it so. A device's predicted peak is the largest, over the steps, of: the parameters and Constants' values
its segments read or make, the tensors the
executor holds there (graph inputs and prelude outputs to the end, others from the step producing them to the last
step reading them, graph outputs to the end), what its runtime keeps for the nodes of its segments that write into
their input's buffer, after their first run (`runtime_kept`), and while a segment runs what it produces and its
workspace, by the liveness rule of `measure.predicted_activation_peak`, with its session's execution frame
(`execution_frame`). The runtimes hold nothing else of a segment
between its calls (`runtimes`: bindings cleared, OpenVINO's request and intermediate memory released), so this is what
they use.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_remat.core.devices import Device
from onnx_remat.core.errors import ModelError, UsageError
from onnx_remat.core.tags import PREFIX, PRELUDE_STEP, node_tags
from onnx_remat.passes.execution_frame import bytes_per_value
from onnx_remat.passes.measure import predicted_activation_peak
from onnx_remat.passes.reads import proto_reads
from onnx_remat.passes.runtime_kept import kept_per_session, kept_per_shared_buffer, sharing_nodes
from onnx_remat.passes.runtimes import Runtime, Values, runtime_for
from onnx_remat.passes.shapes import resolve_shapes
from onnx_remat.passes.sizes import TensorInfo, held_as_initializer, tensor_infos
from onnx_remat.passes.verdict import Verdict, judge
from onnx_remat.passes.workspace import workspace_bytes

HOST = -1  # the "device" of graph inputs given as numpy arrays
# Warm-up runs take at least this long: OpenVINO's first runs of many compiled models in a process are several
# times slower than later ones (measured: a run of 13 OpenVINO segments of a U-Net, 5 ms for the first tens of runs,
# then 1.3 ms).
WARMUP_SECONDS = 0.5
Key = tuple[str, int]  # (tensor name, device index or HOST): a value the executor holds


@dataclass(frozen=True)
class Segment:
    """Consecutive nodes on one device, as a standalone model; `uploads` are held tensors (graph inputs, prelude
    outputs) moved onto the device first, each with the device it comes from."""

    device: int
    model: onnx.ModelProto
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    uploads: tuple[Key, ...]
    activation_bytes: int


@dataclass(frozen=True)
class Handoff:
    """A copy node: tensor `source_name` on device `source` becomes `target_name` on device `target`."""

    node: str
    source_name: str
    target_name: str
    source: int
    target: int


Step = Segment | Handoff


@dataclass(frozen=True)
class Plan:
    """The steps in order, the values to drop after each, where each graph output is, the predicted peaks, the
    parameter bytes each device's segments read and what its runtime keeps for their nodes; `model` is the
    (shape-inferred) model the plan was built from."""

    devices: tuple[Device, ...]
    steps: tuple[Step, ...]
    drops: tuple[tuple[Key, ...], ...]
    outputs: tuple[Key, ...]
    output_names: tuple[str, ...]
    peak_bytes: tuple[int, ...]
    parameter_bytes: tuple[int, ...]
    kept_bytes: tuple[int, ...]
    model: onnx.ModelProto


@dataclass(frozen=True)
class DeviceRun:
    """What running a plan gave: the graph outputs, measured seconds (median over repeats) in total, per device and
    for handoffs, each device's predicted and (if asked) measured peak bytes, one per fresh process, and its budget
    (None: none known)."""

    outputs: dict[str, np.ndarray]
    seconds: float
    device_seconds: dict[str, float]
    handoff_seconds: float
    predicted_peak_bytes: dict[str, int]
    budgets: dict[str, int | None]
    segments: dict[str, int]
    copies: int
    measured_peak_samples: dict[str, tuple[int, ...]] | None = None

    @property
    def measured_peak_bytes(self) -> dict[str, int] | None:
        """Each device's measured peak, the median over the processes measuring it (None: not measured)."""
        if self.measured_peak_samples is None:
            return None
        return {name: int(statistics.median(peaks)) for name, peaks in self.measured_peak_samples.items()}

    @property
    def peak_bytes(self) -> dict[str, int]:
        """The peaks stated against the budgets: measured (median) if measured, else predicted."""
        measured = self.measured_peak_bytes
        return self.predicted_peak_bytes if measured is None else measured

    @property
    def verdicts(self) -> dict[str, Verdict]:
        """Each budgeted device's verdict (`verdict.judge`) on its measured peaks if measured, else its predicted."""
        samples = self.measured_peak_samples or {name: (peak,) for name, peak in self.predicted_peak_bytes.items()}
        return {name: judge(samples[name], budget) for name, budget in self.budgets.items() if budget is not None}

    @property
    def within_budgets(self) -> bool:
        """Whether no device is over its budget: some measurement within it is enough (`verdict`)."""
        return Verdict.OVER not in self.verdicts.values()


def build_plan(model: onnx.ModelProto, devices: Sequence[Device]) -> Plan:
    """Split a rewritten model into per-device segments and copies, and predict each device's peak memory."""
    devices = tuple(devices)
    model = resolve_shapes(model)
    planner = _Planner(model, devices, tensor_infos(model))
    placed = _placements(model, devices)
    sizes = {name: info.allocated_bytes for name, info in planner.infos.items()
             if name not in planner.resident and name not in planner.initializers}
    scratch = [workspace_bytes(node, planner.infos, devices[item.device].threads or 1)
               for node, item in zip(ir.serde.deserialize_model(model).graph, placed, strict=True)]
    return planner.build(_group(placed, sizes, set(planner.graph_outputs), scratch))


def execute(
    plan: Plan,
    feeds: dict[str, np.ndarray],
    repeats: int = 10,
    budgets: dict[str, int] | None = None,
) -> DeviceRun:
    """Compile every segment on its device, run the plan to warm up (once, and for WARMUP_SECONDS at least), then
    `repeats` times timed. Its peaks are predicted; `measure_devices.with_measured_peaks` adds measured ones."""
    runtimes, calls = compile_plan(plan)
    outputs = warm_up(plan, runtimes, calls, feeds)
    timings = [run_plan(plan, runtimes, calls, feeds)[1] for _ in range(max(repeats, 1))]
    del calls, runtimes
    names = [device.name for device in plan.devices]
    per_device = {name: statistics.median(seconds[d] for _, seconds in timings) for d, name in enumerate(names)}
    return DeviceRun(
        outputs=outputs,
        seconds=statistics.median(total for total, _ in timings),
        device_seconds=per_device,
        handoff_seconds=statistics.median(total - sum(seconds) for total, seconds in timings),
        predicted_peak_bytes=dict(zip(names, plan.peak_bytes, strict=True)),
        budgets={name: (budgets or {}).get(name) for name in names},
        segments={name: sum(isinstance(s, Segment) and s.device == d for s in plan.steps) for d, name in
                  enumerate(names)},
        copies=sum(isinstance(s, Handoff) for s in plan.steps),
    )


def race(plans: Sequence[Plan], feeds: dict[str, np.ndarray], rounds: int) -> list[float]:
    """Median seconds of each plan over `rounds` rounds that each run every plan once in turn (after warm-up), so
    that load from other processes hits them alike."""
    compiled = [compile_plan(plan) for plan in plans]
    for plan, (runtimes, calls) in zip(plans, compiled, strict=True):
        warm_up(plan, runtimes, calls, feeds)
    times: list[list[float]] = [[] for _ in plans]
    for _ in range(max(rounds, 1)):
        for samples, plan, (runtimes, calls) in zip(times, plans, compiled, strict=True):
            samples.append(run_plan(plan, runtimes, calls, feeds)[1][0])
    return [statistics.median(samples) for samples in times]


def warm_up(
    plan: Plan, runtimes: list[Runtime], calls: list[Call | None], feeds: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Run the plan once, and again until WARMUP_SECONDS have passed; the first run's outputs."""
    started = time.perf_counter()
    outputs, _ = run_plan(plan, runtimes, calls, feeds)
    while time.perf_counter() - started < WARMUP_SECONDS:
        run_plan(plan, runtimes, calls, feeds)
    return outputs


Call = Callable[[Values], Values]


class Probe(Protocol):
    """Watches a run: `before` a step (a segment's uploads done, its call next; a hand-off's move next) and `after`
    it (its results held, before the drops), each with the step's index and the values the executor holds."""

    def before(self, index: int, values: dict[Key, Any]) -> None: ...

    def after(self, index: int, values: dict[Key, Any]) -> None: ...


def compile_plan(plan: Plan) -> tuple[list[Runtime], list[Call | None]]:
    """Each device's runtime, and every segment compiled on its device (None for a hand-off)."""
    runtimes = [runtime_for(device) for device in plan.devices]
    return runtimes, [runtimes[s.device].compile(s.model) if isinstance(s, Segment) else None for s in plan.steps]


def run_plan(
    plan: Plan,
    runtimes: list[Runtime],
    calls: list[Call | None],
    feeds: dict[str, np.ndarray],
    probe: Probe | None = None,
) -> tuple[dict[str, np.ndarray], tuple[float, list[float]]]:
    """One run of the plan: its graph outputs on the host, and (total seconds, seconds per device)."""
    begin = time.perf_counter()
    values: dict[Key, Any] = {(name, HOST): array for name, array in feeds.items()}
    seconds = [0.0] * len(runtimes)
    for index, (step, call, drops) in enumerate(zip(plan.steps, calls, plan.drops, strict=True)):
        if isinstance(step, Segment):
            assert call is not None
            for name, source in step.uploads:
                values[(name, step.device)] = _move(values[(name, source)], source, step.device, runtimes)
            inputs = {name: values[(name, step.device)] for name in step.inputs}
            if probe:
                probe.before(index, values)
            started = time.perf_counter()
            produced = call(inputs)
            seconds[step.device] += time.perf_counter() - started
            del inputs
            values.update(((name, step.device), produced[name]) for name in step.outputs)
            del produced
        else:
            if probe:
                probe.before(index, values)
            value = values[(step.source_name, step.source)]
            values[(step.target_name, step.target)] = _move(value, step.source, step.target, runtimes)
            del value
        if probe:
            probe.after(index, values)
        for key in drops:
            del values[key]
    outputs = {
        name: values[key] if key[1] == HOST else runtimes[key[1]].to_host(values[key])
        for name, key in zip(plan.output_names, plan.outputs, strict=True)
    }
    return outputs, (time.perf_counter() - begin, seconds)


def _move(value: Any, source: int, target: int, runtimes: list[Runtime]) -> Any:
    """A value on `source` (HOST: a numpy array) as a value on `target`, through host memory."""
    array = value if source == HOST else runtimes[source].to_host(value)
    return runtimes[target].from_host(array)


@dataclass(frozen=True)
class _Placed:
    """A node with its device index; for a copy, also its source device."""

    node: onnx.NodeProto
    device: int
    source: int | None = None


def _placements(model: onnx.ModelProto, devices: tuple[Device, ...]) -> list[_Placed]:
    """Every node with the device it is tagged with; errors name the node and what to do."""
    index = {device.name: k for k, device in enumerate(devices)}
    names = ", ".join(index)
    placed = []
    for node in model.graph.node:
        tags = node_tags(node)
        if tags.device is None:
            raise ModelError(f"node {node.name!r} has no {PREFIX}device tag: run a model written by onnx-remat")
        for place in (tags.device, tags.source) if tags.is_copy else (tags.device,):
            if place not in index:
                raise UsageError(
                    f"the model places node {node.name!r} on device {place!r}, which the devices lack "
                    f"({names}): give the device file the model was rewritten for"
                )
        if tags.is_copy and (node.op_type != "Identity" or len(node.input) != 1 or len(node.output) != 1):
            raise ModelError(f"copy node {node.name!r} must be an Identity with one input and one output")
        source = index[tags.source] if tags.is_copy and tags.source is not None else None
        placed.append(_Placed(node, index[tags.device], source))
    return placed


def _group(
    placed: list[_Placed], sizes: dict[str, int], kept: set[str], scratch: list[int]
) -> list[list[_Placed]]:
    """Same-device runs of nodes and single copies, in execution order. A copy ends the open run when it goes into
    the run's device or is the last reader of its input (so the input is freed where the schedule frees it); any
    other copy waits for the run's end (nothing in the run reads it, its input stays alive anyway). The executor holds
    a run's inputs until the run returns, where the schedule frees each after its last reader, so a run also ends at
    the last reader of one of its inputs when holding the inputs read for the last time so far (`sizes`: bytes of the
    tensors that are not resident) through the rest of the run would take its device above the peak of the schedule's
    memory (`_schedule_memory`; `kept`: tensors held to the end, `scratch`: each node's workspace). Ending runs at
    every such last reader would cut a chain into single nodes: each cut makes the next node's input such an input."""
    last_reader = {name: k for k, item in enumerate(placed) for name in proto_reads(item.node)}
    memory = _schedule_memory(placed, sizes, kept, last_reader, scratch)
    peaks: dict[int, int] = {}
    for item, held in zip(placed, memory, strict=True):
        peaks[item.device] = max(peaks.get(item.device, 0), held)
    ahead = _run_ahead(placed, memory)
    groups: list[list[_Placed]] = []
    current: list[_Placed] = []
    waiting: list[list[_Placed]] = []
    produced: set[str] = set()
    dead = 0  # bytes of the open run's inputs whose last reader ran

    def close() -> None:
        nonlocal dead
        groups.extend([current.copy()] if current else [])
        groups.extend(waiting)
        current.clear()
        waiting.clear()
        produced.clear()
        dead = 0

    for k, item in enumerate(placed):
        if item.source is not None:
            if current and item.device != current[0].device and last_reader[item.node.input[0]] != k:
                waiting.append([item])
            else:
                close()
                groups.append([item])
            continue
        if current and item.device != current[0].device:
            close()
        current.append(item)
        dead += sum(sizes.get(name, 0) for name in set(proto_reads(item.node)) - produced - kept
                    if last_reader[name] == k)
        produced.update(item.node.output)
        if dead and dead + ahead[k] > peaks[item.device]:
            close()
    close()
    return groups


def _schedule_memory(
    placed: list[_Placed], sizes: dict[str, int], kept: set[str], last_reader: dict[str, int], scratch: list[int]
) -> list[int]:
    """Per node, the bytes its device holds while it runs when each tensor (in `sizes`) is freed after its last
    reader, as the schedule frees it (`kept`: held to the end), and its workspace (`scratch`); a copy's is its
    target's."""
    held: dict[int, int] = {}
    freed: dict[int, list[tuple[int, int]]] = {}
    memory = []
    for k, item in enumerate(placed):
        made = [name for name in item.node.output if name in sizes]
        held[item.device] = held.get(item.device, 0) + sum(sizes[name] for name in made)
        memory.append(held[item.device] + scratch[k])
        for name in made:
            if name not in kept:
                freed.setdefault(max(k, last_reader.get(name, k)), []).append((item.device, sizes[name]))
        for device, size in freed.pop(k, []):
            held[device] -= size
    return memory


def _run_ahead(placed: list[_Placed], memory: list[int]) -> list[int]:
    """Per node, the most its device's schedule memory reaches at the later nodes of that device before a node of
    another device or a copy into it, which end a run: how far the rest of its run could go."""
    ahead = [0] * len(placed)
    device, most = -1, 0
    for k in range(len(placed) - 1, -1, -1):
        item = placed[k]
        ahead[k] = most if item.device == device else 0
        if item.source is None:
            most = max(most, memory[k]) if item.device == device else memory[k]
            device = item.device
        elif item.device == device:
            most = 0
    return ahead


class _Planner:
    """Builds the steps of a plan from the grouped nodes: where each value lives, what each step reads and drops."""

    def __init__(self, model: onnx.ModelProto, devices: tuple[Device, ...], infos: dict[str, TensorInfo]):
        self.model = model
        self.devices = devices
        self.infos = infos
        constants = [node for node in model.graph.node if held_as_initializer(node)]
        # parameters and Constants' values: initializers of every segment reading them, as runtimes hold them
        self.initializers = {init.name: init for init in model.graph.initializer} | {
            node.output[0]: _constant_initializer(node) for node in constants}
        self.graph_outputs = [output.name for output in model.graph.output]
        self.home: dict[str, int] = {value.name: HOST for value in model.graph.input if value.name not in
                                     self.initializers}  # tensor -> the device its (first) value is on
        self.held: set[Key] = set()  # values held to the end: graph inputs and prelude outputs where uploaded
        self.read_anywhere = {name for node in model.graph.node for name in proto_reads(node)}
        prelude = [n for n in model.graph.node if node_tags(n).step == PRELUDE_STEP]
        self.resident = set(self.home) | {out for node in prelude for out in node.output if out}

    def build(self, groups: list[list[_Placed]]) -> Plan:
        reads = [self._reads(group) for group in groups]
        last_read: dict[str, int] = {}
        for k, names in enumerate(reads):
            last_read.update(dict.fromkeys(names, k))
        steps: list[Step] = []
        for k, group in enumerate(groups):
            if group[0].source is not None:
                steps.append(self._handoff(group[0]))
            else:
                later = {name for name, step in last_read.items() if step > k} | set(self.graph_outputs)
                steps.append(self._segment(group, reads[k], later))
        drops = self._drops(steps, last_read)
        outputs = tuple((name, self.home[name]) for name in self.graph_outputs)
        parameters = self._parameter_bytes(steps)
        kept = self._kept_bytes(steps)
        base = tuple(p + k for p, k in zip(parameters, kept, strict=True))
        return Plan(self.devices, tuple(steps), drops, outputs, tuple(self.graph_outputs),
                    self._peaks(steps, drops, base), parameters, kept, self.model)

    def _reads(self, group: list[_Placed]) -> list[str]:
        """The tensors a group reads from outside itself (not parameters), in first-use order."""
        produced = {out for item in group for out in item.node.output}
        return list(dict.fromkeys(
            name for item in group for name in proto_reads(item.node)
            if name not in produced and name not in self.initializers
        ))

    def _handoff(self, item: _Placed) -> Handoff:
        node, source = item.node, item.source
        assert source is not None
        if self.home.get(node.input[0]) != source:
            raise ModelError(f"copy node {node.name!r} reads {node.input[0]!r}, which is not on its source device")
        self.home[node.output[0]] = item.device
        return Handoff(node.name, node.input[0], node.output[0], source, item.device)

    def _segment(self, group: list[_Placed], reads: list[str], later: set[str]) -> Segment:
        """The group's nodes as a model; its inputs checked to be on its device or moved there if held everywhere."""
        device = group[0].device
        uploads = []
        for name in reads:
            if self.home.get(name) == device or (name, device) in self.held:
                continue
            if name not in self.resident or name not in self.home:
                where = self.home.get(name)
                place = "nowhere" if where is None else "on " + ("the host" if where == HOST else
                                                                   self.devices[where].name)
                raise ModelError(
                    f"node reading {name!r} on {self.devices[device].name} finds it {place}: "
                    "a tensor crossing devices needs a copy node"
                )
            uploads.append((name, self.home[name]))
            self.held.add((name, device))
        nodes = [item.node for item in group]
        outputs = [
            out for node in nodes for out in node.output
            if out and (out in later or out not in self.read_anywhere)
        ]
        for node in nodes:
            for out in node.output:
                if out:
                    self.home[out] = device
        model = self._submodel(nodes, reads, outputs, device)
        threads = self.devices[device].threads or 1
        return Segment(device, model, tuple(reads), tuple(outputs), tuple(uploads),
                       predicted_activation_peak(model, threads, bytes_per_value(self.devices[device])))

    def _submodel(
        self, nodes: list[onnx.NodeProto], inputs: list[str], outputs: list[str], device: int
    ) -> onnx.ModelProto:
        """A standalone model of `nodes`: the parameters and Constants' values they (or their subgraphs) read as
        initializers (a Constant among `nodes` makes its own), and the whole model's shapes for the tensors inside (a
        shape computed from a tensor another segment hands over, such as a ReduceMean's axes from a Constant node on
        another device, cannot be found in the segment alone)."""
        produced = {name for node in nodes for name in node.output}
        used = {name for node in nodes for name in proto_reads(node)
                if name in self.initializers and name not in produced}
        ends = {*inputs, *outputs}
        inside = dict.fromkeys(out for node in nodes for out in node.output if out and out not in ends)
        graph = helper.make_graph(
            nodes, f"{self.model.graph.name or 'model'} on {self.devices[device].name}",
            [self._value_info(name) for name in inputs], [self._value_info(name) for name in outputs],
            [self.initializers[name] for name in sorted(used)],
            value_info=[self._value_info(name) for name in inside if name in self.infos],
        )
        model = helper.make_model(
            graph, opset_imports=self.model.opset_import, ir_version=self.model.ir_version,
            functions=self.model.functions,
        )
        model.configuration.extend(self.model.configuration)
        return model

    def _value_info(self, name: str) -> onnx.ValueInfoProto:
        if name not in self.infos:
            raise ModelError(f"tensor {name!r} has no concrete shape: fix the model's input shapes")
        info = self.infos[name]
        return helper.make_tensor_value_info(name, info.elem_type, info.shape)

    def _drops(self, steps: list[Step], last_read: dict[str, int]) -> tuple[tuple[Key, ...], ...]:
        """After each step, the values no later step reads (never graph outputs or values held to the end)."""
        drops: list[list[Key]] = [[] for _ in steps]
        keep = set(self.graph_outputs) | self.resident
        for k, step in enumerate(steps):
            written = (
                [(name, step.device) for name in step.outputs] if isinstance(step, Segment)
                else [(step.target_name, step.target)]
            )
            for key in written:
                if key[0] not in keep:
                    drops[max(k, last_read.get(key[0], k))].append(key)
        return tuple(tuple(keys) for keys in drops)

    def _parameter_bytes(self, steps: list[Step]) -> tuple[int, ...]:
        """The bytes of the parameters and Constants' values each device's segments read or make."""
        parameters = [0] * len(self.devices)
        for device in range(len(self.devices)):
            nodes = [node for step in steps if isinstance(step, Segment) and step.device == device
                     for node in step.model.graph.node]
            used = {name for node in nodes for name in (*node.input, *node.output) if name in self.initializers}
            parameters[device] = sum(self.infos[name].allocated_bytes for name in used)
        return tuple(parameters)

    def _kept_bytes(self, steps: list[Step]) -> tuple[int, ...]:
        """What each device's runtime keeps for its segments (each its own session): the stacks of their worker
        threads, and for their nodes writing into their input's buffer (a segment's outputs are its session's graph
        outputs, which a view copies into)."""
        kept = [0] * len(self.devices)
        for step in steps:
            if not isinstance(step, Segment):
                continue
            device, graph = self.devices[step.device], ir.serde.deserialize_model(step.model).graph
            kept[step.device] += kept_per_session(device, graph, self.infos)
            kept[step.device] += kept_per_shared_buffer(device) * len(sharing_nodes(graph, set(step.outputs)))
        return tuple(kept)

    def _peaks(
        self, steps: list[Step], drops: tuple[tuple[Key, ...], ...], parameters: tuple[int, ...]
    ) -> tuple[int, ...]:
        """Each device's predicted peak bytes over the steps (see the module docstring); `parameters` is what each
        device holds throughout: its parameters and what its runtime keeps."""
        sizes = {name: info.allocated_bytes for name, info in self.infos.items()}
        peaks = list(parameters)
        for moment in step_holdings(steps, drops, sizes):
            running = parameters[moment.device] + sum(moment.held.values()) + moment.running
            peaks[moment.device] = max(peaks[moment.device], running)
        return tuple(peaks)


def _constant_initializer(node: onnx.NodeProto) -> onnx.TensorProto:
    """A Constant node's value (any of its attribute forms) as an initializer named as its output."""
    outputs = ReferenceEvaluator(node).run([node.output[0]], {})
    assert isinstance(outputs, list)
    return numpy_helper.from_array(np.asarray(outputs[0]), node.output[0])


@dataclass(frozen=True)
class Holding:
    """What the executor holds on the device a step runs on (a hand-off: its target) at the step's heaviest moment:
    the values by name (a live dict: copy it to keep it) and what a segment's run adds (its outputs and workspace)."""

    index: int
    device: int
    held: dict[str, int]
    running: int


def step_holdings(
    steps: Sequence[Step], drops: Sequence[Sequence[Key]], sizes: dict[str, int]
) -> Iterator[Holding]:
    """Per step, what the executor holds on its device while it runs (`sizes`: allocated bytes by tensor)."""
    held: dict[int, dict[str, int]] = {}
    for index, (step, dropped) in enumerate(zip(steps, drops, strict=True)):
        if isinstance(step, Segment):
            here = held.setdefault(step.device, {})
            here.update((name, sizes[name]) for name, _ in step.uploads)
            yield Holding(index, step.device, here, step.activation_bytes)
            here.update((name, sizes[name]) for name in step.outputs)
        else:
            here = held.setdefault(step.target, {})
            here[step.target_name] = sizes[step.target_name]
            yield Holding(index, step.target, here, 0)
        for name, device in dropped:
            del held[device][name]
