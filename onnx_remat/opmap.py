"""Which ONNX nodes each solver operator stands for: the bridge between a Problem and its graph."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpMap:
    """`node_names[i]`: the names of the ONNX nodes that operator i of the Problem stands for,
    in graph order (one node per operator in inference; a layer group in training).
    `prelude`: nodes computed once before the schedule from constants alone (their outputs are
    counted as resident memory)."""

    node_names: tuple[tuple[str, ...], ...]
    prelude: tuple[str, ...] = ()
