"""A schedule: the ordered list of what runs where, what is freed and what is copied.

Plain data produced by a solver and consumed by the simulator, the rewrite and the report.
`stage` is the paper's timestep: stage t is the one in which operator t is computed for the
first time (Checkmate's frontier-advancing order); recomputations sit in the stage that needs them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Compute:
    """Run operator `op` on `device`; its output becomes resident there."""

    op: int
    stage: int
    device: int = 0


@dataclass(frozen=True)
class Free:
    """Release the output of operator `op` held on `device`."""

    op: int
    stage: int
    device: int = 0


@dataclass(frozen=True)
class Copy:
    """Copy the output of operator `op` from device `source` to device `target`."""

    op: int
    stage: int
    source: int
    target: int


Event = Compute | Free | Copy


@dataclass(frozen=True)
class Schedule:
    """Events in execution order. Every operator is computed at least once."""

    events: tuple[Event, ...]

    @property
    def computes(self) -> tuple[Compute, ...]:
        return tuple(e for e in self.events if isinstance(e, Compute))

    def computed_on(self, device: int) -> set[int]:
        """The operators computed on `device` at least once."""
        return {c.op for c in self.computes if c.device == device}

    def recompute_count(self) -> int:
        """How many computations beyond the first of each operator."""
        computes = self.computes
        return len(computes) - len({c.op for c in computes})

    def matrices(self, num_ops: int, num_devices: int) -> Matrices:
        """R, S and C of the schedule replayed stage by stage (copies counted in the stage they happen)."""
        m = Matrices(
            np.zeros((num_devices, num_ops, num_ops), dtype=bool),
            np.zeros((num_devices, num_ops + 1, num_ops), dtype=bool),
            np.zeros((num_devices, num_devices, num_ops, num_ops), dtype=bool),
        )
        present: list[set[int]] = [set() for _ in range(num_devices)]
        stage = 0

        def advance(to: int) -> None:
            nonlocal stage
            while stage < to:
                stage += 1
                for d, ops in enumerate(present):
                    m.held[d, stage, list(ops)] = True

        for event in self.events:
            advance(event.stage)
            if isinstance(event, Compute):
                m.computed[event.device, event.stage, event.op] = True
                present[event.device].add(event.op)
            elif isinstance(event, Copy):
                m.copied[event.source, event.target, event.stage, event.op] = True
                present[event.target].add(event.op)
            else:
                present[event.device].discard(event.op)
        advance(num_ops)
        return m


@dataclass(frozen=True)
class Matrices:
    """The paper's 0/1 matrices: computed[d,t,i] (R), held[d,t,i] (S: held on d entering stage t; t = T: at the
    end), copied[d,e,t,i] (copied from d to e in stage t). The MILP's variables, the plot's pictures."""

    computed: np.ndarray
    held: np.ndarray
    copied: np.ndarray
