"""Writing outputs safely: paths checked before any work, each file written whole, several outputs all or none."""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from onnx_remat.core.errors import OutputError


def check_outputs(paths: Sequence[str | Path], source: str | Path | None, force: bool) -> None:
    """Refuse, before any work, outputs that repeat each other or the input (even with --force), that are not a
    regular file or absent (a device, FIFO or directory), that exist without --force, or whose directory is missing
    or not writable."""
    seen: dict[Path, Path] = {}
    if source is not None:
        seen[Path(source).resolve()] = Path(source)
    for path in map(Path, paths):
        resolved = path.resolve()
        if resolved in seen:
            what = "the input" if seen[resolved] == Path(source or "") else f"output {seen[resolved]}"
            raise OutputError(f"output {path} is also {what}: give every output its own path")
        seen[resolved] = path
        _check_one(path, force)


def _check_one(path: Path, force: bool) -> None:
    if path.exists() or path.is_symlink():
        mode = path.stat().st_mode if path.exists() else 0
        if not stat.S_ISREG(mode):
            raise OutputError(f"output {path} exists and is not a regular file: choose a file path")
        if not force:
            raise OutputError(f"output {path} already exists: pass --force to overwrite it")
    if not path.parent.is_dir():
        raise OutputError(f"output directory {path.parent} does not exist: create it first")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise OutputError(f"output directory {path.parent} is not writable: choose another")


def write_atomically(target: Path, data: bytes) -> None:
    """Write `data` to a new file beside `target` (permissions from the umask), then rename it into place."""
    write_together({target: data})


def write_together(outputs: Mapping[Path, bytes]) -> None:
    """Write every output to a temporary file beside it, then rename them all into place. A failure while writing
    (a full disk, Ctrl-C) leaves none of them and no temporary file; one while renaming removes the outputs this
    call created (a file it replaced with --force stays replaced)."""
    temps: dict[Path, Path] = {}
    created: list[Path] = []
    try:
        for target, data in outputs.items():
            temp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
            temps[target] = temp
            with open(temp, "xb") as handle:
                handle.write(data)
        for target, temp in temps.items():
            existed = target.exists()
            os.replace(temp, target)
            if not existed:
                created.append(target)
    except BaseException as exc:
        for target in created:
            target.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise OutputError(f"cannot write {exc.filename or 'an output'}: {exc.strerror or exc}") from None
        raise
    finally:
        for temp in temps.values():
            temp.unlink(missing_ok=True)
