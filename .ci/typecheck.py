"""Type-check the package with mypy, each file under the module name it is installed as.

pyproject.toml maps folders to packages (`passes/` is `onnx_remat.passes`, `models/` is `onnx_remat.models`). mypy
names a file by the folders above it and cannot follow the import hook of an editable install, so on its own it would
check `passes/sizes.py` as `passes.sizes` and not find `onnx_remat.passes`. This script lists the package's files as
setuptools does and hands each to mypy with its installed name; the settings are pyproject's [tool.mypy].

    python .ci/typecheck.py
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parent.parent


def package_folder(package: str, package_dir: dict[str, str]) -> Path:
    """The folder setuptools takes `package` from: its own mapping, else its nearest mapped parent's subfolder."""
    parts = package.split(".")
    for end in range(len(parts), 0, -1):
        parent = ".".join(parts[:end])
        if parent in package_dir:
            return ROOT / package_dir[parent] / Path(*parts[end:])
    return ROOT / Path(*parts)


def sources() -> list[BuildSource]:
    """Every module of the packages pyproject lists, with its path relative to the checkout (as messages show it)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = []
    for package in setuptools["packages"]:
        for path in sorted(package_folder(package, setuptools["package-dir"]).glob("*.py")):
            module = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found.append(BuildSource(str(path.relative_to(ROOT)), module))
    return found


def main() -> int:
    modules = sources()
    _, options = process_options([source.path for source in modules if source.path is not None])
    messages: list[str] = []

    def show(filename: str | None, new_messages: list[str], serious: bool) -> None:
        messages.extend(new_messages)
        print(*new_messages, sep="\n", file=sys.stderr if serious else sys.stdout)

    try:
        build.build(modules, options, flush_errors=show)
    except CompileError as error:
        if not messages:
            print(*error.messages, sep="\n", file=sys.stderr)
        return 2
    errors = [message for message in messages if ": error:" in message]
    if errors:
        files = {message.split(":", 1)[0] for message in errors}
        print(f"Found {len(errors)} errors in {len(files)} files (checked {len(modules)} source files)")
        return 1
    print(f"Success: no issues found in {len(modules)} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
