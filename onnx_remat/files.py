"""Writing outputs atomically: a temporary file beside the target, then a rename, never half a file."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def write_atomically(target: Path, data: bytes) -> None:
    """Write `data` to a new file beside `target` (permissions from the umask), then rename it into place."""
    temp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temp, "xb") as handle:
            handle.write(data)
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
