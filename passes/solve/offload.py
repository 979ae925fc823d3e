"""Eviction heuristic: run every operator once on one device, parking outputs on another or recomputing them.

Operators run in topological order on the compute device. When the next step does not fit, held outputs it
does not read are evicted, the one read furthest in the future first (Belady): parked on the store device
(copied there unless already there) when that is cheaper than recomputing it and fits, else dropped. Before an
operator runs, a missing input is copied back if parked, or recomputed (its own missing inputs first, in the
same way). Graph outputs are never dropped, nor outputs of operators computed once (Problem.computed_once) while
a later operator reads them; a recomputation that would need one again (an earlier reader's, after the last reader
ran) does not fit. With no store device it is a pure recomputation heuristic.
What the device's runtime keeps per computation (Problem.kept_bytes) is held from the start for every operator's
first run, and for the recomputations from a reserve taken off the budget: a pass whose recomputations keep more than
its reserve runs again with that as its reserve (at most KEPT_PASSES passes).
A warm start for the MILP, and the answer where the MILP is too large to build. At tight budgets on densely
connected graphs (DenseNet) recomputation can cascade for minutes: a limit on the operator runs tried (work, not
wall time, so a loaded machine gets the same answer) ends it without a schedule.
"""

from __future__ import annotations

import sys
from bisect import bisect_right
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute, Copy, Event, Free, Schedule

FRAMES_PER_RECOMPUTATION = 3
"""Python frames a recomputation cascade nests per operator (run, fetch, and a margin)."""


KEPT_PASSES = 4
"""Passes at most, each with the kept bytes of the previous one's recomputations as its reserve."""


class _OutOfWork(Exception):
    """The operator runs tried reached their limit before every operator ran."""


@dataclass
class Work:
    """Operator runs the heuristic may still try, shared by the calls of one search: the whole search's work bound."""

    runs: int


class _Evictor:
    """Mutable state of the heuristic: what each device holds, its memory, the events so far."""

    def __init__(
        self, problem: Problem, compute: int, store: int | None, max_runs: int | None, reserve: int, work: Work | None
    ):
        self.problem, self.compute, self.store, self.max_runs, self.work = problem, compute, store, max_runs, work
        self.held: list[set[int]] = [set() for _ in problem.devices]
        self.memory = list(problem.resident_bytes)  # the store device only holds copies: it loads nothing
        every = range(problem.num_ops)  # every operator runs once on the compute device, loading what it reads
        self.memory[compute] = problem.resident_with(compute, every) + problem.kept_of(compute, every)
        self.budgets = list(problem.budgets)
        self.budgets[compute] -= reserve
        self.kept_again = 0
        """Bytes the runtime keeps for the recomputations so far: held from the start, within the reserve."""
        self.runs = 0
        self.successors = problem.successors
        self.missing_inputs_seconds = [sum(problem.cost[compute][i] for i in inputs) for inputs in problem.predecessors]
        """Per operator, the seconds recomputing those of its inputs the compute device does not hold takes, kept as
        outputs are placed there and freed (figured at each score, they took half the heuristic's time)."""
        self.outputs = frozenset(problem.graph_outputs)
        self.end = problem.num_ops
        self.events: list[Event] = []
        self.once = frozenset(problem.computed_once)
        self.computed: set[int] = set()
        self.parked: dict[int, int] = {}
        """The stage each output was last parked in (a copy must not be dropped in the stage it is made)."""
        self.last_read_in = _last_readers(problem)

    def next_use(self, op: int, after: int) -> int:
        """The first reader of `op` after stage `after`; n for a graph output nobody reads later; -1: dead."""
        readers = self.successors[op]
        index = bisect_right(readers, after)
        return readers[index] if index < len(readers) else (self.end if op in self.outputs else -1)

    def kept(self, op: int, stage: int) -> bool:
        """Whether `op`'s output may not be dropped after `stage`: a graph output, or an operator computed once that is
        read later (it cannot be recomputed)."""
        return op in self.outputs or (op in self.once and self.next_use(op, stage) >= 0)

    def place(self, op: int, device: int, event: Event) -> None:
        self.events.append(event)
        self.held[device].add(op)
        self.memory[device] += self.problem.output_bytes[op]
        if device == self.compute:
            self.count_input(op, -1.0)

    def free(self, op: int, device: int, stage: int) -> None:
        self.events.append(Free(op, stage, device))
        self.held[device].discard(op)
        self.memory[device] -= self.problem.output_bytes[op]
        if device == self.compute:
            self.count_input(op, 1.0)

    def count_input(self, op: int, sign: float) -> None:
        """Count `op`'s recomputation in (sign 1: freed) or out of (-1: placed) its readers' missing inputs."""
        seconds = sign * self.problem.cost[self.compute][op]
        for reader in self.successors[op]:
            self.missing_inputs_seconds[reader] += seconds

    def park(self, op: int, stage: int, keep: set[int]) -> bool:
        """Whether `op` is (now) on the store device, copied there if parking beats recomputing and fits (dropping
        no parked output in `keep` to make room)."""
        p = self.problem
        if self.store is None:
            return False
        if op in self.held[self.store]:
            return True
        if self.next_use(op, stage) < 0:
            return False  # nobody reads it any more: a copy would be wasted
        round_trip = p.copy_seconds(op, self.compute, self.store) + p.copy_seconds(op, self.store, self.compute)
        if round_trip > p.cost[self.compute][op] and not self.kept(op, stage):
            return False
        worth = float("inf") if self.kept(op, stage) else self.density(op)
        self.unpark(self.store, p.output_bytes[op], stage, worth, keep)
        if self.memory[self.store] + p.output_bytes[op] > self.budgets[self.store]:
            return False
        self.place(op, self.store, Copy(op, stage, self.compute, self.store))
        self.parked[op] = stage
        return True

    def density(self, op: int) -> float:
        """Seconds to recompute `op` on the compute device per byte it holds."""
        return self.problem.cost[self.compute][op] / max(1, self.problem.output_bytes[op])

    def unpark(self, store: int, needed: int, stage: int, worth: float, keep: set[int]) -> None:
        """Drop parked outputs cheaper to recompute per byte than `worth` (cheapest first; they will be recomputed)
        until `needed` more bytes fit on the store device, if they can: a kept output cannot be dropped, nor an
        output parked in this stage (the MILP the schedule warm-starts forbids a copy nobody uses), nor one in
        `keep` (an input being copied back)."""
        p = self.problem
        room = self.budgets[store] - self.memory[store]
        droppable = [
            op
            for op in self.held[store]
            if not self.kept(op, stage) and op not in keep and self.parked[op] < stage and self.density(op) < worth
        ]
        if room >= needed or room + sum(p.output_bytes[op] for op in droppable) < needed:
            return
        for op in sorted(droppable, key=self.density):
            if self.memory[store] + needed <= self.budgets[store]:
                return
            self.free(op, store, stage)

    def recompute_seconds(self, op: int) -> float:
        """Seconds recomputing `op` takes: its own run and those of its inputs the compute device no longer holds. Its
        own cost alone rated an output whose inputs were gone as cheap, and evicting it started a cascade at its
        reader (gpt's training step: the least budget fitting fell from 19.2 to 16.7 MiB counting them; measured)."""
        return self.problem.cost[self.compute][op] + self.missing_inputs_seconds[op]

    def score(self, op: int, stage: int) -> float:
        """Evict the lowest first: dead outputs, then the cheapest to restore per byte and per stage until use."""
        p = self.problem
        use = self.next_use(op, stage)
        if use < 0:
            return -1.0
        restore = self.recompute_seconds(op)
        if self.store is not None:
            trips = 1 if op in self.held[self.store] or op in self.outputs else 2
            restore = min(restore, trips * p.copy_seconds(op, self.compute, self.store))
        return restore / (max(1, p.output_bytes[op]) * (use - stage))

    def make_room(self, needed: int, keep: set[int], stage: int) -> bool:
        """Evict from the compute device (dead outputs, then furthest next use first) until `needed` more bytes fit;
        False if they cannot."""
        if self.memory[self.compute] + needed <= self.budgets[self.compute]:
            return True  # nothing to evict: spares scoring every held output
        candidates = sorted(self.held[self.compute] - keep, key=lambda op: self.score(op, stage))
        while self.memory[self.compute] + needed > self.budgets[self.compute]:
            if not candidates:
                return False
            op = candidates.pop(0)
            if not self.park(op, stage, keep) and self.kept(op, stage):
                continue
            self.free(op, self.compute, stage)
        return True

    def fetch(self, op: int, stage: int, keep: set[int]) -> bool:
        """Make `op` held on the compute device in `stage` (copy back or recompute), keeping `keep`; False if not."""
        p = self.problem
        if op in self.held[self.compute]:
            return True
        if self.store is not None and op in self.held[self.store]:
            if not self.make_room(p.output_bytes[op], keep | {op}, stage):
                return False
            self.place(op, self.compute, Copy(op, stage, self.store, self.compute))
            return True
        return self.run(op, stage, keep)

    def run(self, op: int, stage: int, keep: set[int]) -> bool:
        """Fetch `op`'s inputs and compute it on the compute device in `stage`; False if it cannot fit, or would be
        a second computation of an operator computed once."""
        p = self.problem
        self.runs += 1
        if self.max_runs is not None and self.runs > self.max_runs:
            raise _OutOfWork
        if self.work is not None:
            self.work.runs -= 1
            if self.work.runs < 0:
                raise _OutOfWork
        if op in self.once and op in self.computed:
            return False
        inputs = set(p.predecessors[op])
        pinned = keep | inputs
        for i in sorted(inputs):  # a loop, not all(...): nested calls then take no C stack (see offload)
            if not self.fetch(i, stage, pinned):
                return False
        if not self.make_room(p.output_bytes[op] + p.workspace_bytes[op], pinned, stage):
            return False
        if op in self.computed:
            self.kept_again += p.kept_bytes[self.compute][op]
        self.place(op, self.compute, Compute(op, stage, self.compute))
        self.computed.add(op)
        return True

    def step(self, v: int) -> bool:
        """Run v with its inputs brought back, free what nobody reads any more; False if it cannot fit. What every
        step before left held is read after it, so only the outputs placed now and those v reads last can be dead."""
        start = len(self.events)
        if not self.run(v, v, set()):
            return False
        placed = {event.op for event in self.events[start:]}
        devices = {self.compute} if self.store is None else {self.compute, self.store}
        for device in sorted(devices):
            candidates = (placed | self.last_read_in[v]) & self.held[device]
            for op in sorted(op for op in candidates if self.next_use(op, v) == -1):
                self.free(op, device, v)
        return True


def _last_readers(problem: Problem) -> list[set[int]]:
    """Per stage v, the operators whose last reader is v."""
    found: list[set[int]] = [set() for _ in range(problem.num_ops)]
    for op, readers in enumerate(problem.successors):
        if readers:
            found[readers[-1]].add(op)
    return found


def offload(
    problem: Problem, compute: int, store: int | None = None, max_runs: int | None = None, work: Work | None = None
) -> Schedule | None:
    """The schedule running on `compute`, parking on `store` (None: recompute only), or None if it cannot fit, a
    pass tries more than `max_runs` operator runs (None: no limit) or `work` runs out (None: no limit)."""
    reserve = 0
    for _ in range(KEPT_PASSES):
        state = _Evictor(problem, compute, store, max_runs, reserve, work)
        try:
            with _recursion_room(problem.num_ops):
                if not all(state.step(v) for v in range(problem.num_ops)):
                    return None
        except _OutOfWork:
            return None
        if state.kept_again <= reserve:
            return Schedule(tuple(state.events))
        reserve = state.kept_again
    return None


@contextmanager
def _recursion_room(operators: int) -> Iterator[None]:
    """Room for a recomputation cascade through every operator: each recomputed operator is a nested run -> fetch
    call (ShuffleNetV2's training step at its minimum went past Python's default of 1000 frames)."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(before + FRAMES_PER_RECOMPUTATION * operators)
    try:
        yield
    finally:
        sys.setrecursionlimit(before)
