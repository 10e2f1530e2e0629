"""Atomic file writes (an interrupted run leaves the old file or the new one, never half of one)
and where paragraph caches what it works out."""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from paragraph.errors import FileWriteError


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, then rename it over
    (`atomic_write`)."""
    atomic_write(path, lambda f: f.write(data))


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> None:
    """Call ``write`` on a temporary file beside ``path``, fsync it, then rename it over: a
    large file is streamed, never held in memory whole. The file gets the permissions a
    plain write would (0666 less the umask). A failure to write (permission, read-only file
    system, disk full) raises `FileWriteError`, one line naming the path, and leaves the old
    file as it was; so does any exception ``write`` raises (re-raised)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise FileWriteError(str(path), e) from e
    try:
        os.fchmod(fd, 0o666 & ~current_umask(path.parent))  # mkstemp makes 0600
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise FileWriteError(str(path), e) from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def current_umask(directory: str | os.PathLike[str] = ".") -> int:
    """The process's umask, read without changing it: ``os.umask(0)`` then putting it back
    leaves a moment in which a file that another thread (Python's or native) creates gets
    mode 0666. Linux reports it in ``/proc/self/status``; elsewhere a probe file is created in
    ``directory`` (mode 0666 asked, what the umask leaves is read back) and removed."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass  # not Linux (or before 4.7): probe
    probe = Path(directory) / f".umask-probe-{os.getpid()}-{threading.get_ident()}"
    fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    try:
        return 0o666 & ~os.fstat(fd).st_mode & 0o777
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """``obj`` as indented JSON, written atomically."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def cache_dir() -> Path:
    """Where paragraph caches costs, proofs and its native runner: ``$PARAGRAPH_CACHE_DIR`` or
    ``~/.cache/paragraph``."""
    return Path(os.environ.get("PARAGRAPH_CACHE_DIR") or Path.home() / ".cache" / "paragraph")
