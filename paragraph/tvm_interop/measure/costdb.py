"""The cost database: an SQLite file (``~/.cache/paragraph/costs.sqlite``, or
``$PARAGRAPH_CACHE_DIR``) of measured seconds keyed by target, kernel structural hash, tuning
database and kernel source (plus a free-form configuration such as a thread count or a stage
signature). Every write is one transaction; a corrupt file is moved aside with a warning and
rebuilt."""

from __future__ import annotations

import os
import sqlite3
import statistics
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paragraph.files import cache_dir
from paragraph.timing import Timing


@dataclass(frozen=True)
class CostKey:
    """What a cost depends on: where it ran, which kernel, which tuning, which source, how."""

    target: str
    kernel: str  # structural hash of the kernel (or of a stage of kernels)
    tuning: str = ""  # tuning database identity ("" = untuned)
    source: str = "tvm"  # kernel source: tvm | vendor
    config: str = ""  # e.g. "threads=2"


class CostDB:
    """SQLite cost cache; see the module docstring."""

    SCHEMA = """CREATE TABLE IF NOT EXISTS costs (
        target TEXT, kernel TEXT, tuning TEXT, source TEXT, config TEXT,
        median REAL, p10 REAL, p90 REAL, repeats INTEGER, measured_at REAL,
        PRIMARY KEY (target, kernel, tuning, source, config))"""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path else cache_dir() / "costs.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.conn = self._open()

    def _open(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, check_same_thread=False)
            ok = conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
            if not ok:
                raise sqlite3.DatabaseError("quick_check failed")
            conn.execute(self.SCHEMA)
            conn.execute("SELECT target, kernel, tuning, source, config, median FROM costs "
                         "LIMIT 1").fetchall()
            conn.commit()
            return conn
        except sqlite3.DatabaseError as e:
            try:
                conn.close()
            except Exception:
                pass
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            self.path.replace(aside)
            warnings.warn(f"cost database {self.path} was corrupt ({e}); moved it to {aside} "
                          "and started a new one", RuntimeWarning, stacklevel=3)
            conn = sqlite3.connect(self.path, check_same_thread=False)
            conn.execute(self.SCHEMA)
            conn.commit()
            return conn

    def get(self, key: CostKey) -> float | None:
        """The cached median seconds for ``key``, or None."""
        with self._lock:
            row = self.conn.execute(
                "SELECT median FROM costs WHERE target=? AND kernel=? AND tuning=? AND source=? "
                "AND config=?", (key.target, key.kernel, key.tuning, key.source, key.config)
            ).fetchone()
        return None if row is None else float(row[0])

    def put(self, key: CostKey, timing: Timing) -> None:
        """Store a measurement (one atomic transaction; replaces an older one)."""
        s = timing.samples
        row = (key.target, key.kernel, key.tuning, key.source, key.config,
               statistics.median(s), float(np.percentile(s, 10)), float(np.percentile(s, 90)),
               len(s), time.time())
        with self._lock, self.conn:
            self.conn.execute("INSERT OR REPLACE INTO costs VALUES (?,?,?,?,?,?,?,?,?,?)", row)

    def __len__(self) -> int:
        with self._lock:
            return self.conn.execute("SELECT COUNT(*) FROM costs").fetchone()[0]

    def close(self) -> None:
        self.conn.close()
