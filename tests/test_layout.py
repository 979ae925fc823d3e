"""The package's layers import downward only: core <- passes, models <- the pipeline's top <- cli."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from import_graph import layer, layer_edges, modules, upward  # noqa: E402


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert upward() == []


def test_core_imports_nothing_outside_core() -> None:
    assert [edge for edge in layer_edges() if edge[0] == "core"] == []


def test_every_layer_has_modules() -> None:
    assert {layer(name) for name in modules()} == {"core", "models", "passes", "top", "cli"}
