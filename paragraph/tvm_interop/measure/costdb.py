"""The cost database: an SQLite file (``~/.cache/paragraph/costs.sqlite``, or
``$PARAGRAPH_CACHE_DIR``) of measured seconds keyed by target, kernel structural hash, tuning
database and kernel source (plus a free-form configuration such as a thread count or a stage
signature), and by the versions that change a measurement (`cost_versions`: paragraph's, TVM's,
PyTorch's): a cost measured by another version is a miss. Every write is one transaction.

What goes wrong with a shared file on a real disk, and what happens then:

* another process holds the file (``database is locked``, busy) or the disk fails for a moment
  (an I/O error): the operation is retried with short backoff for ``retry_s`` seconds (5 by
  default); if it persists, a `CacheError` says so in one line and the file stays in place;
* the file cannot be written (a read-only directory or file system, a full disk): what it
  holds is still read, and this run's measurements are kept in memory (one warning);
* the file is not an SQLite database or is damaged (truncated mid-write, malformed pages):
  it is moved aside as ``costs.sqlite.corrupt-TIME`` (a warning names it) and a new one is
  started; never for a lock or a full disk, which damage nothing;
* another schema version wrote it: each schema has a table of its own (``costs_v2``; version
  1's ``costs`` is left as it is), so versions share a file without reading each other's rows.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from importlib import metadata
from pathlib import Path
from typing import TypeVar

import numpy as np
import tvm

from paragraph.errors import CacheError
from paragraph.files import cache_dir
from paragraph.timing import Timing
from paragraph.version import __version__

T = TypeVar("T")

RETRY_S = 5.0  # how long a locked or failing database is retried before it is an error
TABLE = "costs_v2"  # the schema's own table: other schema versions keep theirs

# SQLite's primary result codes (`sqlite3.Error.sqlite_errorcode & 0xff`) by what they mean
# here; a code not named is an error to report
_LOCKED = {5, 6}  # SQLITE_BUSY, SQLITE_LOCKED: another connection holds the file
_FLAKY = {10}  # SQLITE_IOERR: the disk failed this time
_UNWRITABLE = {3, 8, 13, 14}  # PERM, READONLY, FULL, CANTOPEN: it cannot be written here
_DAMAGED = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB
_FULL = 13
_warned: set[tuple[str, str]] = set()  # (path, what): each warning once per process


@dataclass(frozen=True)
class CostKey:
    """What a cost depends on: where it ran, which kernel, which tuning, which source, how."""

    target: str
    kernel: str  # structural hash of the kernel (or of a stage of kernels)
    tuning: str = ""  # tuning database identity ("" = untuned)
    source: str = "tvm"  # kernel source: tvm | vendor
    config: str = ""  # e.g. "threads=2"


@cache
def cost_versions() -> str:
    """The versions a measurement depends on: paragraph's (its kernels, its runner), TVM's
    (the code it generates) and PyTorch's where installed (the vendor kernels)."""
    parts = [f"paragraph {__version__}", f"tvm {tvm.__version__}"]
    try:
        parts.append(f"torch {metadata.version('torch')}")
    except metadata.PackageNotFoundError:
        pass
    return "; ".join(parts)


def _code(e: sqlite3.Error) -> int:
    """SQLite's primary result code of ``e`` (from the message where Python gives none)."""
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return int(code) & 0xFF
    text = str(e)
    for words, guess in (("locked", 5), ("disk I/O", 10), ("full", 13), ("readonly", 8),
                         ("unable to open", 14), ("malformed", 11), ("not a database", 26)):
        if words in text:
            return guess
    return 1  # SQLITE_ERROR


class CostDB:
    """SQLite cost cache; see the module docstring. ``versions`` replaces `cost_versions` (a
    cost stored under other versions is not seen); ``retry_s`` is how long a locked or
    failing file is retried (default `RETRY_S`)."""

    SCHEMA = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        versions TEXT, target TEXT, kernel TEXT, tuning TEXT, source TEXT, config TEXT,
        median REAL, p10 REAL, p90 REAL, repeats INTEGER, measured_at REAL,
        PRIMARY KEY (versions, target, kernel, tuning, source, config))"""
    COLUMNS = "versions, target, kernel, tuning, source, config, median"

    def __init__(self, path: str | os.PathLike | None = None, *, versions: str | None = None,
                 retry_s: float | None = None) -> None:
        self.path = Path(path) if path else cache_dir() / "costs.sqlite"
        self.versions = versions if versions is not None else cost_versions()
        self.retry_s = RETRY_S if retry_s is None else retry_s
        self._lock = threading.RLock()
        self._memory: dict[tuple[str, ...], float] = {}  # what could not be written
        self.writable = True  # False: new measurements stay in `_memory`
        self.conn: sqlite3.Connection | None = None
        self._closed = False
        self._open()

    # -- opening, and recovering from a damaged file
    def _open(self, again: int = 0) -> None:
        """Open the file (retrying a lock), check it, make this schema's table. A damaged
        file is moved aside and a new one started (``again``: how many times already); one
        that cannot be created or written leaves this run's costs in memory."""
        if again > 2:  # something keeps putting a damaged file back
            raise CacheError(f"the cost database {self.path} is damaged again each time it is "
                             "replaced; remove it")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = self._retrying(lambda: sqlite3.connect(self.path, timeout=0.1,
                                                          check_same_thread=False))
        except (OSError, sqlite3.Error) as e:
            if isinstance(e, sqlite3.Error) and _code(e) in _LOCKED | _FLAKY:
                raise self._error(e, "open") from None
            self._in_memory(f"cannot create it: {_reason(e)}")
            return
        inode = _inode(self.path)
        try:
            self._retrying(lambda: self._check(conn))
        except sqlite3.Error as e:
            conn.close()
            if _code(e) not in _DAMAGED:
                raise self._error(e, "open") from None
            self._move_aside(str(e), inode)
            self._open(again + 1)
            return
        self.conn = conn
        try:
            self._retrying(lambda: self._create(conn))
        except sqlite3.Error as e:
            if _code(e) not in _UNWRITABLE | _FLAKY:
                conn.close()
                self.conn = None
                raise self._error(e, "open") from None
            if not self._has_table(conn):  # nothing to read either
                conn.close()
                self.conn = None
            self._in_memory(_reason(e))

    def _check(self, conn: sqlite3.Connection) -> None:
        """`PRAGMA quick_check`; a damaged file raises (as SQLITE_CORRUPT) whichever way
        SQLite reports it; so does this schema's table with other columns."""
        found = conn.execute("PRAGMA quick_check").fetchone()
        if found is None or found[0] != "ok":
            raise _Damaged(f"integrity check: {found[0] if found else 'no answer'}")
        if self._has_table(conn):
            try:
                conn.execute(f"SELECT {self.COLUMNS} FROM {TABLE} LIMIT 1").fetchall()
            except sqlite3.OperationalError as e:  # a table of ours with other columns
                raise _Damaged(f"its {TABLE} table is not this schema's: {e}") from None

    def _create(self, conn: sqlite3.Connection) -> None:
        if not self._has_table(conn):
            with conn:
                conn.execute(self.SCHEMA)

    @staticmethod
    def _has_table(conn: sqlite3.Connection) -> bool:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?",
                            (TABLE,)).fetchone() is not None

    def _move_aside(self, reason: str, inode: int | None) -> None:
        """Rename the damaged file (and its journal) aside, with a warning naming where; if
        another process already did (the file is another one now), leave the new one."""
        if inode is not None and _inode(self.path) != inode:
            return
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        try:
            self.path.replace(aside)
        except FileNotFoundError:
            return
        except OSError as e:  # a directory we cannot write: read nothing, keep costs in memory
            raise CacheError(f"the cost database {self.path} is damaged ({reason}) and "
                             f"cannot be moved aside ({_reason(e)}); remove it") from None
        for suffix in ("-journal", "-wal", "-shm"):  # a hot journal belongs to the old file
            extra = self.path.with_name(self.path.name + suffix)
            if extra.exists():
                extra.replace(aside.with_name(aside.name + suffix))
        warnings.warn(f"cost database {self.path} was damaged ({reason}); moved it to {aside} "
                      "and started a new one", RuntimeWarning, stacklevel=4)

    def _recover(self, e: sqlite3.Error) -> None:
        """The open file turned out damaged: move it aside and open a new one."""
        inode = _inode(self.path)
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        self._move_aside(str(e), inode)
        self._open()

    def _in_memory(self, reason: str) -> None:
        self.writable = False
        if (str(self.path), "memory") not in _warned:
            _warned.add((str(self.path), "memory"))
            still = "what it holds is still used, and " if self.conn is not None else ""
            warnings.warn(f"cost database {self.path} cannot be written ({reason}): {still}"
                          "this run's measurements are kept in memory only", RuntimeWarning,
                          stacklevel=4)

    # -- retries and errors
    def _retrying(self, op: Callable[[], T]) -> T:
        """``op()``, again after a lock or an I/O error, with backoff (10 ms doubling to a
        quarter second) until ``retry_s`` has passed; then its error is raised."""
        deadline = time.monotonic() + self.retry_s
        delay = 0.01
        while True:
            try:
                return op()
            except sqlite3.Error as e:
                transient = _code(e) in _LOCKED | _FLAKY or _code(e) == _FULL
                if not transient or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(2 * delay, 0.25)

    def _error(self, e: sqlite3.Error, doing: str) -> _Failure:
        """The one line for an error that stayed past the retries."""
        code = _code(e)
        if code in _LOCKED:
            return _Failure(e, f"the cost database {self.path} stayed locked by another process "
                              f"for {self.retry_s:g} s ({e}) while trying to {doing} it; run "
                              "again when that process is done, or set PARAGRAPH_CACHE_DIR "
                              "to another directory")
        if code in _FLAKY:
            return _Failure(e, f"cannot {doing} the cost database {self.path}: {e} (for "
                            f"{self.retry_s:g} s)")
        return _Failure(e, f"cannot {doing} the cost database {self.path}: {e}")

    def _run(self, op: Callable[[sqlite3.Connection], T], doing: str) -> T:
        """``op(conn)``, retried; a damaged file found now is moved aside and ``op`` runs on
        the new one; any other error that stays is a `CacheError`."""
        for attempt in range(2):
            if self._closed:
                raise CacheError(f"the cost database {self.path} is closed")
            assert self.conn is not None  # callers check
            try:
                return self._retrying(partial(op, self.conn))
            except sqlite3.Error as e:
                if _code(e) not in _DAMAGED or attempt:
                    raise self._error(e, doing) from None
                self._recover(e)
                if self.conn is None:
                    raise self._error(e, doing) from None
        raise AssertionError("unreachable")

    # -- the cache
    def _row(self, key: CostKey) -> tuple[str, ...]:
        return (self.versions, key.target, key.kernel, key.tuning, key.source, key.config)

    def get(self, key: CostKey) -> float | None:
        """The cached median seconds for ``key`` measured by these `versions`, or None."""
        row = self._row(key)
        with self._lock:
            if row in self._memory:
                return self._memory[row]
            if self.conn is None:
                if self._closed:
                    raise CacheError(f"the cost database {self.path} is closed")
                return None
            found = self._run(lambda c: c.execute(
                f"SELECT median FROM {TABLE} WHERE versions=? AND target=? AND kernel=? AND "
                "tuning=? AND source=? AND config=?", row).fetchone(), "read")
        return None if found is None else float(found[0])

    def put(self, key: CostKey, timing: Timing) -> None:
        """Store a measurement (one atomic transaction; replaces an older one). Where the file
        cannot take it (read-only, disk full) it is kept in memory for this run."""
        s = timing.samples
        row, median = self._row(key), float(statistics.median(s))
        values = (*row, median, float(np.percentile(s, 10)), float(np.percentile(s, 90)),
                  len(s), time.time())

        def insert(conn: sqlite3.Connection) -> None:
            with conn:
                conn.execute(f"INSERT OR REPLACE INTO {TABLE} VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                             values)

        with self._lock:
            if self._closed:
                raise CacheError(f"the cost database {self.path} is closed")
            if self.writable and self.conn is not None:
                try:
                    self._run(insert, "write")
                    return
                except _Failure as e:
                    if e.code not in _UNWRITABLE | _FLAKY:
                        raise
                    self._in_memory(e.reason)
            self._memory[row] = median

    def __len__(self) -> int:
        """How many costs these `versions` have here (in the file and in memory)."""
        def count(conn: sqlite3.Connection) -> int:
            return int(conn.execute(f"SELECT COUNT(*) FROM {TABLE} WHERE versions=?",
                                    (self.versions,)).fetchone()[0])

        def in_file(row: tuple[str, ...], conn: sqlite3.Connection) -> bool:
            return conn.execute(f"SELECT 1 FROM {TABLE} WHERE versions=? AND target=? AND "
                                "kernel=? AND tuning=? AND source=? AND config=?",
                                row).fetchone() is not None

        with self._lock:
            if self.conn is None:
                return len(self._memory)
            return self._run(count, "read") + sum(
                not self._run(partial(in_file, row), "read") for row in self._memory)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self.conn is not None:
                self.conn.close()
                self.conn = None


class _Failure(CacheError):
    """A `CacheError` that remembers SQLite's code and reason (`put` falls back on memory
    for some)."""

    def __init__(self, cause: sqlite3.Error, message: str) -> None:
        super().__init__(message)
        self.code, self.reason = _code(cause), _reason(cause)


class _Damaged(sqlite3.DatabaseError):
    """A check found the file damaged though SQLite raised nothing: counts as SQLITE_CORRUPT."""

    sqlite_errorcode = 11


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


def _reason(e: BaseException) -> str:
    """A short reason: the system's for a file error, SQLite's message for its own."""
    if isinstance(e, OSError):
        return e.strerror or str(e)
    if isinstance(e, sqlite3.Error) and _code(e) == _FULL:
        return f"disk full: {e}"
    return str(e)
