"""Replay a schedule event by event and measure its memory and cost, independently of any solver.

Semantics (the solvers' model): each device always holds its resident bytes, the loaded groups (`Problem.loaded`:
parameters, inputs) read by an operator the schedule computes on it (as `onnx-remat run` loads them before the run),
and what its runtime keeps for every computation the schedule runs on it (`Problem.kept_bytes`: kept from a
computation's first run on, so held at every step of the runs after it). `Compute` needs every input on its device
and its own output absent there; while it runs the device holds its output plus its workspace, after
it the workspace is released and the output stays. `Free` needs the output present. `Copy` needs it
on the source and absent on the target, then holds it on both. At the end every graph output is held
on some device and every operator has been computed at least once; an operator the problem computes once
(`Problem.computed_once`, a random one) is computed exactly once.

Replayed `as_run` (the report's prediction), two things count as `run` holds them, below the solvers' model (which
stays an upper bound, so that a schedule the solvers fit in a budget fits there too): an input the schedule frees
after an operator (nothing on the device reads it in between) is held only until the operator's last node reading it
(`Problem.node_steps`: onnxruntime frees a tensor after its last reader), and with several devices a session's frame
is held only while its stretch of computations runs (`Problem.segment_frame`), not bounded by every computation's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from onnx_remat.core.errors import ScheduleError
from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute, Copy, Event, Free, Schedule


@dataclass(frozen=True)
class Simulation:
    """What replaying a schedule measured: peak memory and memory after each event per device, cost."""

    peak_bytes: tuple[int, ...]
    memory_trace: tuple[tuple[int, ...], ...]
    compute_cost: float
    copy_cost: float

    @property
    def total_cost(self) -> float:
        return self.compute_cost + self.copy_cost

    def fits(self, budgets: Sequence[int]) -> bool:
        """Whether every device's peak is within its budget."""
        return all(peak <= budget for peak, budget in zip(self.peak_bytes, budgets, strict=True))


class _Replay:
    """Mutable replay state: which outputs each device holds, its memory, its peak, the costs."""

    def __init__(self, problem: Problem, events: Sequence[Event], as_run: bool):
        self.problem = problem
        self.held: list[set[int]] = [set() for _ in problem.devices]
        self.memory = _held_throughout(problem, events, as_run)
        self.peak = list(self.memory)
        self.trace: list[list[int]] = [[] for _ in problem.devices]
        self.freed_after = _inputs_freed_after(problem, events) if as_run else {}
        self.frames = _session_frames(problem, events) if as_run else {}
        self.computed: set[int] = set()
        self.once = frozenset(problem.computed_once)
        self.compute_cost = 0.0
        self.copy_cost = 0.0
        self.stage = 0

    def name(self, op: int) -> str:
        return f"{op} ({self.problem.op_names[op]})"

    def check_event(self, index: int, event: Event) -> None:
        """Reject an event naming an unknown operator or device, or a stage going backwards."""
        n, d = self.problem.num_ops, self.problem.num_devices
        devices = (event.source, event.target) if isinstance(event, Copy) else (event.device,)
        if not 0 <= event.op < n:
            raise ScheduleError(f"event #{index} {event}: operator {event.op} is not in 0..{n - 1}")
        if any(not 0 <= device < d for device in devices):
            raise ScheduleError(f"event #{index} {event}: device out of range 0..{d - 1}")
        if not self.stage <= event.stage < n:
            raise ScheduleError(f"event #{index} {event}: stage {event.stage} is not in {self.stage}..{n - 1}")
        self.stage = event.stage

    def compute(self, index: int, event: Compute) -> None:
        held = self.held[event.device]
        missing = [p for p in self.problem.predecessors[event.op] if p not in held]
        if missing:
            raise ScheduleError(
                f"event #{index}: computing operator {self.name(event.op)} on device {event.device} "
                f"needs input {self.name(missing[0])}, which is not held there"
            )
        if event.op in held:
            raise ScheduleError(
                f"event #{index}: operator {self.name(event.op)} is computed on device {event.device} "
                "while its output is already held there"
            )
        if event.op in self.once and event.op in self.computed:
            raise ScheduleError(
                f"event #{index}: operator {self.name(event.op)} is computed again, but it may be computed only "
                "once (a random operator: another run draws other values): hold or copy its output instead"
            )
        size = self.problem.output_bytes[event.op]
        running = (self.memory[event.device] + self.problem.running_bytes(event.op, self.freed_after.get(index, ()))
                   + self.frames.get(index, 0))
        self.peak[event.device] = max(self.peak[event.device], running)
        self.memory[event.device] += size
        held.add(event.op)
        self.computed.add(event.op)
        self.compute_cost += self.problem.cost[event.device][event.op]

    def free(self, index: int, event: Free) -> None:
        if event.op not in self.held[event.device]:
            raise ScheduleError(
                f"event #{index}: freeing operator {self.name(event.op)} on device {event.device}, "
                "where its output is not held"
            )
        self.held[event.device].remove(event.op)
        self.memory[event.device] -= self.problem.output_bytes[event.op]

    def copy(self, index: int, event: Copy) -> None:
        if event.op not in self.held[event.source]:
            raise ScheduleError(
                f"event #{index}: copying operator {self.name(event.op)} from device {event.source}, "
                "where its output is not held"
            )
        if event.op in self.held[event.target]:
            raise ScheduleError(
                f"event #{index}: copying operator {self.name(event.op)} to device {event.target}, "
                "where its output is already held"
            )
        size = self.problem.output_bytes[event.op]
        self.held[event.target].add(event.op)
        self.memory[event.target] += size
        self.peak[event.target] = max(self.peak[event.target], self.memory[event.target])
        self.copy_cost += self.problem.copy_seconds(event.op, event.source, event.target)

    def record(self) -> None:
        for device, memory in enumerate(self.memory):
            self.trace[device].append(memory)

    def check_end(self) -> None:
        """Every operator ran at least once and every graph output is held somewhere."""
        never = sorted(set(range(self.problem.num_ops)) - self.computed)
        if never:
            raise ScheduleError(f"operator {self.name(never[0])} is never computed")
        for op in self.problem.graph_outputs:
            if not any(op in held for held in self.held):
                raise ScheduleError(f"graph output {self.name(op)} is not held on any device at the end")


def _held_throughout(problem: Problem, events: Sequence[Event], as_run: bool) -> list[int]:
    """Per device, what it holds for the whole run: its resident bytes, the loaded groups its computations read and
    what its runtime keeps for them; `as_run`, less the bound of its sessions' frames they hold for the solvers
    (`Problem.segment_frame`: counted per session instead). Events out of range count nothing: the replay rejects
    them."""
    ops, devices = range(problem.num_ops), range(problem.num_devices)
    computations: list[list[int]] = [[] for _ in devices]
    for event in events:
        if isinstance(event, Compute) and event.op in ops and event.device in devices:
            computations[event.device].append(event.op)
    frame = problem.segment_frame if as_run else None
    return [problem.resident_with(device, computed) + problem.kept_of(device, computed)
            - (0 if frame is None else frame.bound_bytes(problem.devices[device], computed))
            for device, computed in enumerate(computations)]


def _inputs_freed_after(problem: Problem, events: Sequence[Event]) -> dict[int, frozenset[int]]:
    """Per Compute event (by index) of an operator with node steps, its inputs whose next event on its device is
    their Free: the schedule frees them after it, so they die at its last node reading them (events out of range
    count nothing: the replay rejects them)."""
    if not problem.node_steps:
        return {}
    ops, devices = range(problem.num_ops), range(problem.num_devices)
    freed_next: set[tuple[int, int]] = set()  # (operator, device) whose next event is its Free
    found: dict[int, frozenset[int]] = {}
    for index in reversed(range(len(events))):
        event = events[index]
        if isinstance(event, Free):
            freed_next.add((event.op, event.device))
        elif isinstance(event, Copy):
            freed_next -= {(event.op, event.source), (event.op, event.target)}
        elif isinstance(event, Compute) and event.op in ops and event.device in devices:
            if reads := problem.node_steps[event.op].last_reads:
                found[index] = frozenset(source for source, _ in reads if (source, event.device) in freed_next)
            freed_next -= {(op, event.device) for op in (event.op, *problem.predecessors[event.op])}
    return found


def _session_frames(problem: Problem, events: Sequence[Event]) -> dict[int, int]:
    """Per Compute event (by index), the frame its session holds while it runs (`Problem.segment_frame`): the session
    runs the stretch of consecutive computations on the device that the event belongs to, which a computation on
    another device ends, as `run` ends a segment there (it may end one earlier: the stretch's frame is the larger)."""
    frame = problem.segment_frame
    if frame is None:
        return {}
    ops, devices = range(problem.num_ops), range(problem.num_devices)
    computes = [(index, event) for index, event in enumerate(events)
                if isinstance(event, Compute) and event.op in ops and event.device in devices]
    found: dict[int, int] = {}
    start = 0
    for end in range(1, len(computes) + 1):
        if end == len(computes) or computes[end][1].device != computes[start][1].device:
            stretch = computes[start:end]
            size = frame.session_bytes(problem.devices[stretch[0][1].device], [event.op for _, event in stretch])
            found.update((index, size) for index, _ in stretch)
            start = end
    return found


def simulate(problem: Problem, schedule: Schedule, as_run: bool = False) -> Simulation:
    """Replay `schedule` on `problem`; raise ScheduleError on the first invalid event. `as_run` counts what `run`
    holds where the solvers' model holds more (see the module docstring): the report's prediction."""
    replay = _Replay(problem, schedule.events, as_run)
    for index, event in enumerate(schedule.events):
        if not isinstance(event, (Compute, Free, Copy)):
            raise ScheduleError(f"event #{index} is not a Compute, Free or Copy: {event!r}")
        replay.check_event(index, event)
        if isinstance(event, Compute):
            replay.compute(index, event)
        elif isinstance(event, Free):
            replay.free(index, event)
        else:
            replay.copy(index, event)
        replay.record()
    replay.check_end()
    return Simulation(
        peak_bytes=tuple(replay.peak),
        memory_trace=tuple(tuple(trace) for trace in replay.trace),
        compute_cost=replay.compute_cost,
        copy_cost=replay.copy_cost,
    )


def check_schedule(problem: Problem, schedule: Schedule) -> Simulation:
    """Simulate `schedule` and also raise ScheduleError if any device's peak exceeds its budget."""
    simulation = simulate(problem, schedule)
    for device, (peak, budget) in enumerate(zip(simulation.peak_bytes, problem.budgets, strict=True)):
        if peak > budget:
            raise ScheduleError(
                f"device {device} ({problem.devices[device]}) peaks at {peak} bytes, above its budget of {budget} bytes"
            )
    return simulation
