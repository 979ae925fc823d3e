"""A schedule: the ordered list of what runs where, what is freed and what is copied.

Plain data produced by a solver and consumed by the simulator, the rewrite and the report.
`stage` is the paper's timestep: stage t is the one in which operator t is computed for the
first time (Checkmate's frontier-advancing order); recomputations sit in the stage that needs them.
"""

from __future__ import annotations

from dataclasses import dataclass


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

    def recompute_count(self) -> int:
        """How many computations beyond the first of each operator."""
        computes = self.computes
        return len(computes) - len({c.op for c in computes})

    def compute_matrix(self, num_ops: int, device: int = 0) -> list[list[bool]]:
        """R[t][i]: operator i is computed in stage t on `device` (the paper's R)."""
        matrix = [[False] * num_ops for _ in range(num_ops)]
        for c in self.computes:
            if c.device == device:
                matrix[c.stage][c.op] = True
        return matrix
