"""The solver's problem: a DAG of operators with costs and sizes on one or more devices.

Plain data, free of ONNX: the solver sees only this. Operators are numbered 0..n-1 in a
topological order; operator i produces one output of `output_bytes[i]` bytes (all of the outputs
of the ONNX nodes it stands for that are consumed outside it, taken together).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

from onnx_remat.core.allocation import allocated_bytes


@dataclass(frozen=True)
class Loaded:
    """Tensors a device holds for the whole run once an operator reading them runs there (parameters, graph inputs,
    the prelude's outputs), as `onnx-remat run` loads them: `bytes[d]` on device d, `readers` the operators reading
    them, ascending."""

    bytes: tuple[int, ...]
    readers: tuple[int, ...]


@dataclass(frozen=True)
class NodeSteps:
    """An operator's nodes as its runtime runs them, one after another: `bytes[k]` its own tensors while node k runs
    (its outputs written so far, internal tensors while live, the node's scratch), and `last_reads`, (input operator,
    k) pairs: node k is the last reading that input, which the runtime frees after it when nothing later reads it."""

    bytes: tuple[int, ...] = ()
    last_reads: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class SegmentFrame:
    """With several devices, what a runtime session holds beside tensors while it runs (onnxruntime's execution
    frame, one block of `value_bytes` per value of the session: `allocation.allocated_bytes`), where each stretch of
    consecutive computations on a device runs as a session of its own: `value_bytes` by device name (a problem
    restricted to one of its devices keeps it), `values[i]` the values operator i's nodes read or write, and
    `rounding_bytes` the most the block takes beyond them."""

    value_bytes: tuple[tuple[str, int], ...]
    values: tuple[int, ...]
    rounding_bytes: int

    def session_bytes(self, device: str, computations: Iterable[int]) -> int:
        """The frame of a session on `device` running these computations (operators, one entry each)."""
        return allocated_bytes(dict(self.value_bytes).get(device, 0) * sum(self.values[op] for op in computations))

    def bound_bytes(self, device: str, computations: Iterable[int]) -> int:
        """What holds the frame of any session on `device` among these computations (none: no session): the solvers'
        bound, which `Problem.kept_bytes` and `loaded` hold."""
        each, ops = dict(self.value_bytes).get(device, 0), list(computations)
        return self.rounding_bytes + each * sum(self.values[op] for op in ops) if each and ops else 0


@dataclass(frozen=True)
class Problem:
    """Operators, edges, per-device costs and budgets.

    - `cost[d][i]`: seconds to run operator i on device d.
    - `workspace_bytes[i]`: transient memory while operator i runs (freed when it ends).
    - `resident_bytes[d]`: memory held on device d for the whole run whatever runs there (with one device, the
      parameters and graph inputs).
    - `loaded`: memory held on a device for the whole run only if one of its readers is computed there
      (`loaded_bytes`): with several devices, the parameters and graph inputs. Default none.
    - `budgets[d]`: bytes device d may hold at any moment, resident memory included.
    - `graph_outputs`: operators whose output must be held (on any device) at the end.
    - `copy_seconds_per_byte[d][e]`, `copy_fixed_seconds[d][e]`: moving an output of b bytes from device d to
      device e costs `fixed + per_byte * b` seconds (`copy_seconds`); the fixed part is what every hand-off
      pays whatever its size (a runtime call on e, moving the tensor across). Default no fixed part.
    - `kept_bytes[d][i]`: bytes device d's runtime keeps for each computation of operator i there, from the
      computation's first run on (onnxruntime's state per node: passes/runtime_kept.py). Every run after the first
      holds them at every step, so device d holds the sum over the schedule's computations on d for the whole run,
      beside its resident bytes. Default none.
    - `computed_once`: operators that may be computed only once, on one device (random ones: a second run draws
      other values than the first, so readers of the two would disagree); their output is held, or copied,
      from that computation to its last use.
    - `node_steps[i]`: operator i node by node (`NodeSteps`), where an input it reads last can be freed before it
      ends: a computation of i after which the schedule frees that input holds it only until its last reading node.
      The simulation replayed as `run` counts this; the solvers hold every input to the end, an upper bound. Default
      none known.
    - `segment_frame`: with several devices, the frame a session holds while it runs (`SegmentFrame`). `kept_bytes`
      and `loaded` hold a bound of it for the solvers: every computation's values kept on its device to the end and
      `rounding_bytes` held once the device computes anything (`SegmentFrame.bound_bytes`); the simulation replayed as
      `run` counts each stretch's own frame while it runs instead. Default none.
    """

    op_names: tuple[str, ...]
    edges: tuple[tuple[int, int], ...]
    output_bytes: tuple[int, ...]
    cost: tuple[tuple[float, ...], ...]
    resident_bytes: tuple[int, ...]
    budgets: tuple[int, ...]
    graph_outputs: tuple[int, ...]
    devices: tuple[str, ...] = ("cpu",)
    workspace_bytes: tuple[int, ...] = field(default=())
    copy_seconds_per_byte: tuple[tuple[float, ...], ...] = field(default=((0.0,),))
    copy_fixed_seconds: tuple[tuple[float, ...], ...] = field(default=())
    computed_once: tuple[int, ...] = ()
    kept_bytes: tuple[tuple[int, ...], ...] = field(default=())
    loaded: tuple[Loaded, ...] = ()
    node_steps: tuple[NodeSteps, ...] = ()
    segment_frame: SegmentFrame | None = None

    def __post_init__(self) -> None:
        n = len(self.op_names)
        if not self.workspace_bytes:
            object.__setattr__(self, "workspace_bytes", (0,) * n)
        if not self.kept_bytes:
            object.__setattr__(self, "kept_bytes", tuple((0,) * n for _ in self.devices))
        if not self.copy_fixed_seconds:
            object.__setattr__(self, "copy_fixed_seconds", tuple((0.0,) * len(self.devices) for _ in self.devices))
        for name, value in (("output_bytes", self.output_bytes), ("workspace_bytes", self.workspace_bytes)):
            if len(value) != n:
                raise ValueError(f"{name} has {len(value)} entries for {n} operators")
        d = len(self.devices)
        if len(self.cost) != d or any(len(row) != n for row in self.cost):
            raise ValueError("cost must be devices x operators")
        if len(self.kept_bytes) != d or any(len(row) != n for row in self.kept_bytes):
            raise ValueError("kept_bytes must be devices x operators")
        if len(self.budgets) != d or len(self.resident_bytes) != d:
            raise ValueError("budgets and resident_bytes need one entry per device")
        for name, matrix in (("copy_seconds_per_byte", self.copy_seconds_per_byte),
                             ("copy_fixed_seconds", self.copy_fixed_seconds)):
            if len(matrix) != d or any(len(row) != d for row in matrix):
                raise ValueError(f"{name} must be devices x devices")
        for u, v in self.edges:
            if not 0 <= u < v < n:
                raise ValueError(f"edge ({u}, {v}) is not forward in the topological order")
        for group in self.loaded:
            if len(group.bytes) != d or not group.readers or any(not 0 <= op < n for op in group.readers):
                raise ValueError(f"loaded group {group} needs bytes per device and readers in 0..{n - 1}")
        if self.node_steps:
            self._check_node_steps()
        if self.segment_frame is not None and len(self.segment_frame.values) != n:
            raise ValueError(f"segment_frame has values for {len(self.segment_frame.values)} operators, not {n}")
        if any(not 0 <= op < n for op in self.computed_once) or len(set(self.computed_once)) != len(self.computed_once):
            raise ValueError(f"computed_once {self.computed_once} must list distinct operators in 0..{n - 1}")

    def _check_node_steps(self) -> None:
        """One NodeSteps per operator, each last read naming an input operator and one of its nodes."""
        if len(self.node_steps) != len(self.op_names):
            raise ValueError(f"node_steps has {len(self.node_steps)} entries for {len(self.op_names)} operators")
        inputs: list[set[int]] = [set() for _ in self.op_names]
        for u, v in self.edges:
            inputs[v].add(u)
        for op, steps in enumerate(self.node_steps):
            for source, node in steps.last_reads:
                if source not in inputs[op] or not 0 <= node < len(steps.bytes):
                    raise ValueError(f"operator {op}'s last read ({source}, {node}) needs an input operator and one "
                                     f"of its {len(steps.bytes)} nodes")

    def running_bytes(self, op: int, freed_inputs: Iterable[int] = ()) -> int:
        """What a computation of `op` adds to its device's memory while it runs: its output and workspace, less each
        of `freed_inputs` (input operators freed after it) at the nodes after the last reading it (`node_steps`)."""
        whole = self.output_bytes[op] + self.workspace_bytes[op]
        steps = self.node_steps[op] if self.node_steps else NodeSteps()
        freed = set(freed_inputs)
        released = [0] * len(steps.bytes)
        for source, node in steps.last_reads:
            if source in freed and node + 1 < len(released):
                released[node + 1] += self.output_bytes[source]
        if not any(released):
            return whole
        gone, most = 0, 0
        for held, extra in zip(steps.bytes, released, strict=True):
            gone += extra
            most = max(most, held - gone)
        return min(whole, most)

    @property
    def num_ops(self) -> int:
        return len(self.op_names)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @cached_property
    def predecessors(self) -> tuple[tuple[int, ...], ...]:
        """predecessors[v]: the operators whose outputs v reads, ascending."""
        preds: list[list[int]] = [[] for _ in range(self.num_ops)]
        for u, v in self.edges:
            preds[v].append(u)
        return tuple(tuple(sorted(set(p))) for p in preds)

    @cached_property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        """successors[u]: the operators that read u's output, ascending."""
        succs: list[list[int]] = [[] for _ in range(self.num_ops)]
        for u, v in self.edges:
            succs[u].append(v)
        return tuple(tuple(sorted(set(s))) for s in succs)

    def copy_seconds(self, op: int, source: int, target: int) -> float:
        """Seconds to move operator `op`'s output from device `source` to device `target`."""
        fixed = self.copy_fixed_seconds[source][target]
        return fixed + self.output_bytes[op] * self.copy_seconds_per_byte[source][target]

    def kept_of(self, device: int, computations: Iterable[int]) -> int:
        """Bytes `device`'s runtime keeps for these computations (operators, one entry per computation) on it."""
        kept = self.kept_bytes[device]
        return sum(kept[op] for op in computations)

    def loaded_bytes(self, device: int, computed: Iterable[int]) -> int:
        """Bytes of the `loaded` groups `device` holds when these operators are computed on it."""
        if not self.loaded:
            return 0
        ops = set(computed)
        return sum(group.bytes[device] for group in self.loaded if not ops.isdisjoint(group.readers))

    def resident_with(self, device: int, computed: Iterable[int]) -> int:
        """What `device` holds for the whole run when these operators are computed on it: its resident bytes and the
        loaded groups they read."""
        return self.resident_bytes[device] + self.loaded_bytes(device, computed)

    def keep_all_bytes(self, device: int = 0) -> int:
        """The paper's 100%: resident memory plus every operator output held at once, plus the largest
        operator workspace, so that keeping everything always fits in 100%; and what the runtime keeps for every
        operator computed once there (every operator computed there, loading what they read)."""
        every = range(self.num_ops)
        return (self.resident_with(device, every) + self.kept_of(device, every) + sum(self.output_bytes)
                + max(self.workspace_bytes, default=0))
