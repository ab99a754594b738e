"""Writing user files safely: never over an existing file without --force, and atomically (temporary file
in the same folder, then rename), so an interrupted write leaves nothing half-written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from llmplan.errors import LlmplanError


def write_atomic(path: Path, text: str, force: bool = False) -> None:
    path = Path(path)
    if path.exists() and not force:
        raise LlmplanError(f"{path} already exists; pass --force to overwrite it")
    if path.parent and not path.parent.exists():
        raise LlmplanError(f"folder {path.parent} does not exist")
    fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
