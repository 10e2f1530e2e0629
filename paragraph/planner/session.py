"""A planning `Session`: what every decision of one compile shares, made once.

The target, the cost database, the tuning database, the cores, where progress goes, and the
`Meter` that times programs (this machine's, caching in the cost database; or a device behind
TVM's RPC tracker). Decisions take a session instead of those settings one by one, and never
ask whether the meter is local or remote.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import tvm

from paragraph.progress import Log, info
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.build.tuning_db import tuning_id
from paragraph.tvm_interop.measure.costdb import CostDB
from paragraph.tvm_interop.meter.local import LocalMeter
from paragraph.tvm_interop.meter.protocol import Meter
from paragraph.tvm_interop.runtime.program import KernelProgram
from paragraph.tvm_interop.runtime.target import is_cpu, resolve_target


class Session:
    """One compile's shared settings (see the module docstring).

    ``target`` is anything `resolve_target` takes (by default this CPU, or a ``remote``
    device's own target); ``db`` a cost database (the default one, opened here and closed by
    `close`, when None); ``tuning_db`` a MetaSchedule work directory whose applied records
    builds use; ``cores`` the cores to plan for (default: all of the device's); ``log`` where
    progress lines go (default: the ``paragraph`` logger, `paragraph.progress.info`);
    ``remote`` a `paragraph.tvm_interop.meter.remote.Remote` to measure on instead of here.
    A session is a context manager; `close` closes only what it opened.
    """

    def __init__(self, target: Any = None, *, db: CostDB | None = None,
                 tuning_db: str | os.PathLike[str] | None = None, cores: int | None = None,
                 log: Log | None = None, remote: Meter | None = None) -> None:
        # a remote device's own target unless the caller names one (a compile for it with
        # options of its own)
        default = getattr(remote, "target", None)
        self.target: tvm.target.Target = resolve_target(target if target is not None
                                                        else default)
        self._own_db = CostDB() if db is None else None
        self.db: CostDB = db if db is not None else self._own_db  # type: ignore[assignment]
        self.tuning_db = None if tuning_db is None else str(tuning_db)
        self.tuning = tuning_id(self.tuning_db)  # cost keys name the tuned records
        self.meter: Meter = remote if remote is not None else LocalMeter(self.db, self.tuning)
        self.cores: int = cores or self.meter.cores
        self.log: Log = log or info

    @property
    def on_cpu(self) -> bool:
        """Whether the session's target is a CPU."""
        return is_cpu(self.target)

    def build(self, mod: Any, kernels: str, rewrites: Sequence[str] = (), *,
              target: tvm.target.Target | None = None,
              device: tvm.runtime.Device | None = None) -> KernelProgram:
        """``mod`` (a Relax module, or an operator graph prepared and dispatched already)
        built with the session's tuning database for ``target`` (the session's by default:
        a rewrite of a program is built for the program's own, `build_program`)."""
        return build_program(mod, target or self.target, device=device,
                             tuning_db=self.tuning_db, kernels=kernels, rewrites=rewrites)

    def close(self) -> None:
        """Close the cost database if the session opened it."""
        if self._own_db is not None:
            self._own_db.close()
            self._own_db = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
