"""The native CPU stream runner (``stream_runner.cc``): built once with the system C++ compiler
against TVM FFI's headers, cached under `paragraph.files.cache_dir`, loaded as a TVM FFI module.

The CPU executor uses it when it is available: each worker then runs its whole stream in C++,
without the GIL, and a cross-stream wait spins on an atomic flag while the producer runs instead
of sleeping on a Python ``Event`` (a hand-off of under 1 us instead of 11-33 us here). Without a
compiler, or with ``PARAGRAPH_NATIVE=0``, the executor runs its streams in Python (same results,
slower hand-offs); `unavailable_reason` says why.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import tvm_ffi
import tvm_ffi.libinfo

from paragraph.errors import ParagraphError
from paragraph.files import cache_dir

SOURCE = Path(__file__).with_name("stream_runner.cc")
SPIN_NS = 1_000_000  # how long a cross-stream wait spins before it sleeps
_lock = threading.Lock()
_state: dict[str, object] = {}


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")


def build_library(source: Path, out: Path, *, includes: tuple[str, ...] = (),
                  libs: tuple[str, ...] = (), flags: tuple[str, ...] = ()) -> None:
    """Compile ``source`` against TVM FFI (and ``includes``/``libs``) to the shared library
    ``out``, atomically: a temporary file renamed over, so an interrupted build leaves none."""
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX)")
    paths = [f"-I{p}" for p in (*tvm_ffi.libinfo.include_paths(), *includes)]
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        cmd = [cxx, "-std=c++20", "-O2", "-fPIC", "-shared", *flags, *paths, str(source), "-o",
               tmp, tvm_ffi.libinfo.find_libtvm_ffi(), *libs]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)


def library_path() -> Path:
    """Where the runner built from this source for this TVM FFI version is cached."""
    key = hashlib.sha256(SOURCE.read_bytes() + tvm_ffi.__version__.encode()).hexdigest()[:16]
    return cache_dir() / "native" / f"stream_runner-{key}.so"


def runner():
    """The loaded runner module, built on first use; None when unavailable (see
    `unavailable_reason`) or switched off with ``PARAGRAPH_NATIVE=0``."""
    if os.environ.get("PARAGRAPH_NATIVE", "1") == "0":
        return None
    with _lock:
        if "module" not in _state:
            _state["module"], _state["reason"] = None, None
            try:
                path = library_path()
                if not path.exists():
                    build_library(SOURCE, path)
                _state["module"] = tvm_ffi.load_module(str(path))
                _state["path"] = path  # where it was, whatever cache is set later
            except Exception as exc:  # no compiler, headers or loader: the Python runner works
                _state["reason"] = f"{type(exc).__name__}: {exc}"
                warnings.warn("paragraph's native stream runner is unavailable, so the CPU "
                              "executor runs its streams in Python (same results, slower "
                              f"cross-stream hand-offs): {_state['reason']}", RuntimeWarning,
                              stacklevel=2)
        return _state["module"]


def unavailable_reason() -> str | None:
    """Why `runner` returned None (None when it is available or not tried yet)."""
    if os.environ.get("PARAGRAPH_NATIVE", "1") == "0":
        return "PARAGRAPH_NATIVE=0"
    return _state.get("reason")  # type: ignore[return-value]


class StreamProgram:
    """A schedule's streams handed to the native runner: per stream, per step ``(function or
    None, args, wait slots, signal slot or -1)``; flags are slots ``0 .. num_flags - 1``."""

    def __init__(self, module, streams: list[list[tuple]], num_flags: int,
                 spin_ns: int) -> None:
        self._m, self.spin_ns = module, spin_ns
        self.handle = module["paragraph_stream_build"](
            [[[fn, list(args), list(waits), signal] for fn, args, waits, signal in steps]
             for steps in streams], num_flags, spin_ns)
        self._run = module["paragraph_stream_run"]
        self._reset = module["paragraph_stream_reset"]  # looked up once: each run resets

    def _live(self) -> int:
        if not self.handle:  # a freed handle would be a dangling pointer in C++
            raise ParagraphError("the stream program is closed")
        return self.handle

    def reset(self) -> None:
        """Clear every flag and the error before a run."""
        self._reset(self._live())

    def run(self, stream: int, profile: bool = False) -> int:
        """Run one stream (GIL released): -1 when it finished, the index of its failing step
        (`error` says why; the other streams stop), or -2 when it stopped for another stream's
        failure or `abort`."""
        return self._run(self._live(), stream, profile)

    def abort(self) -> None:
        """Stop every stream at its next step (waiters wake up)."""
        self._m["paragraph_stream_abort"](self._live())

    def error(self, stream: int) -> str:
        """Why ``stream``'s failing step failed in the last run ("" if it did not)."""
        return str(self._m["paragraph_stream_error"](self._live(), stream))

    def times(self, stream: int) -> list[int]:
        """Start and end (steady clock ns) of every step of ``stream`` in the last profiled run."""
        return list(self._m["paragraph_stream_times"](self._live(), stream))

    def close(self) -> None:
        if self.handle:
            self._m["paragraph_stream_free"](self.handle)
            self.handle = 0

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
