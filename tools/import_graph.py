"""The package's import graph by layer, bottom to top, and any import that goes upward.

Layers, bottom first: `core` (plain data: problem, schedule, budgets, devices, tags, options, errors, files), `passes`
(graph work, solvers, runtimes; `passes.solve` and `passes.autodiff` are its parts), the top of `onnx_remat`
(pipeline, report, sweep and the other stages) and `cli`. A module may import its own layer and those below it;
`models` (builders) sits beside `passes`. Prints one line per pair of layers with the number of import statements.

Run: python tools/import_graph.py
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"onnx_remat": "onnx_remat", "passes": "onnx_remat.passes", "models": "onnx_remat.models"}
RANK = {"core": 0, "models": 1, "passes": 1, "top": 2, "cli": 3}
"""Layer -> height: an import from a layer to a higher one is upward."""


def layer(module: str) -> str:
    """The layer of a module of the package, by its installed name."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ("core", "cli", "passes", "models"):
        return parts[1]
    return "top"


def modules() -> dict[str, Path]:
    """Installed module name -> source file, for every module of the package."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join([package, *parts]).removesuffix(".__init__")
            found.setdefault(name, path)
    return found


def imports(path: Path) -> list[str]:
    """The package modules a source file imports, at any depth (lazy imports inside functions count too)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return [name for name in names if name == "onnx_remat" or name.startswith("onnx_remat.")]


def layer_edges() -> Counter[tuple[str, str]]:
    """(importing layer, imported layer) -> number of import statements, across layers only."""
    edges: Counter[tuple[str, str]] = Counter()
    for name, path in modules().items():
        for imported in imports(path):
            if imported != "onnx_remat" and layer(name) != layer(imported):
                edges[layer(name), layer(imported)] += 1
    return edges


def upward() -> list[str]:
    """Every import from a lower layer to a higher one, as 'module -> imported'."""
    return [f"{name} -> {imported}" for name, path in modules().items() for imported in imports(path)
            if imported != "onnx_remat" and RANK[layer(imported)] > RANK[layer(name)]]


def main() -> None:
    for (source, target), count in sorted(layer_edges().items(), key=lambda e: (RANK[e[0][0]], e[0])):
        print(f"{source:>6} -> {target:<6} {count:3d} imports")
    wrong = upward()
    print(*(["upward imports:", *wrong] if wrong else ["no upward imports"]), sep="\n")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
