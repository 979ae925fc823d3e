"""Which ONNX nodes each solver operator stands for: the bridge between a Problem and its graph."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpMap:
    """`node_names[i]`: the names of the ONNX nodes that operator i of the Problem stands for,
    in graph order (one node per operator in inference; a layer group in training).
    `prelude`: nodes computed once before the schedule from constants alone (their outputs are
    counted as resident memory). `roles[i]`: what operator i is in the model, `forward` or
    `backward` (all forward when empty)."""

    node_names: tuple[tuple[str, ...], ...]
    prelude: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()

    def role(self, op: int) -> str:
        """The role of operator `op`'s first computation."""
        return self.roles[op] if self.roles else "forward"
