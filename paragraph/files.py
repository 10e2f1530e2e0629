"""Atomic file writes (an interrupted run leaves the old file or the new one, never half of one)
and where paragraph caches what it works out."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, then rename it over."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; a plain write would not
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """``obj`` as indented JSON, written atomically."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def cache_dir() -> Path:
    """Where paragraph caches costs, proofs and its native runner: ``$PARAGRAPH_CACHE_DIR`` or
    ``~/.cache/paragraph``."""
    return Path(os.environ.get("PARAGRAPH_CACHE_DIR") or Path.home() / ".cache" / "paragraph")
