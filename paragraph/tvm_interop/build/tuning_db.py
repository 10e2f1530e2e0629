"""A MetaSchedule tuning database on disk, and the part of it paragraph applies.

``paragraph tune`` writes MetaSchedule's JSON database (``database_workload.json``,
``database_tuning_record.json``) and, beside it, ``applied/``: the same workloads with the
records of only those kernels whose tuned form measured faster than the untuned one alone and
that the model check kept (`paragraph.planner.model_check.check_models`: the model run end to
end with them against the model untuned, side by side). Lowering applies ``applied/`` where it
exists (`applied_dir`), so a tuning database applies neither a kernel that measured slower
alone (MetaSchedule's best record of a small kernel, a reshape, a pool, a concatenation, is
often slower than TVM's default code) nor a set of kernels that made the checked model slower
(kernels faster alone have run a model 15% slower together: `benchmarks/tuning.py`).
``paragraph-tune-model.json`` records that check. A database that paragraph did not write (no
``applied/``) is applied whole. Measurements in the state file are paragraph's and TVM's of
the versions that made them: another version measures again (`read_state`). A work directory
that cannot be written is a `paragraph.errors.FileWriteError` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from paragraph.files import atomic_write_bytes
from paragraph.tvm_interop.measure.costdb import cost_versions

STATE_FILE = "paragraph-tune.json"
RECORDS = "database_tuning_record.json"
WORKLOADS = "database_workload.json"
APPLIED = "applied"
MODEL_FILE = "paragraph-tune-model.json"


def workload_key(shash: str | int) -> str:
    """A workload's key as `paragraph.tvm_interop.tune.metaschedule` writes it (16 hex digits of the
    structural hash) from the decimal hash in MetaSchedule's workload file."""
    return f"{int(shash) & (2**64 - 1):016x}"


def applied_dir(work_dir: str | os.PathLike[str]) -> Path:
    """The directory whose records lowering applies: ``applied/`` where ``paragraph tune``
    wrote one, else the database itself."""
    work = Path(work_dir)
    applied = work / APPLIED
    return applied if (applied / RECORDS).exists() and (applied / WORKLOADS).exists() else work


def tuning_id(work_dir: str | os.PathLike[str] | None) -> str:
    """A short identity of the records a tuning database applies ("" for none), for cost cache
    keys: costs measured with one set of tuned kernels do not stand for another."""
    if work_dir is None:
        return ""
    path = applied_dir(work_dir) / RECORDS
    if not path.exists():
        return ""
    return "ms:" + hashlib.blake2b(path.read_bytes(), digest_size=8).hexdigest()


def write_applied(work_dir: str | os.PathLike[str], apply: Mapping[str, bool],
                  out: str | os.PathLike[str] | None = None) -> tuple[int, int]:
    """Write ``applied/`` (or ``out``): every workload, and the records of the workloads whose
    key ``apply`` maps to True (a workload it does not name is left out: not yet compared).
    Returns (kernels applied, kernels left untuned). Each file is written atomically, the
    records last, so an interrupted write applies no more than before."""
    work = Path(work_dir)
    workloads = (work / WORKLOADS).read_bytes().splitlines(keepends=True) \
        if (work / WORKLOADS).exists() else []
    keep_index = set()
    for i, line in enumerate(workloads):
        try:
            key = workload_key(json.loads(line)[0])
        except (ValueError, IndexError, TypeError):
            continue  # a torn line: its records are not applied
        if apply.get(key, False):
            keep_index.add(i)
    records = []
    if (work / RECORDS).exists():
        for line in (work / RECORDS).read_bytes().splitlines(keepends=True):
            try:
                index = json.loads(line)[0]
            except (ValueError, IndexError, TypeError):
                continue
            if index in keep_index:
                records.append(line if line.endswith(b"\n") else line + b"\n")
    out = work / APPLIED if out is None else Path(out)
    atomic_write_bytes(out / WORKLOADS, b"".join(workloads))
    atomic_write_bytes(out / RECORDS, b"".join(records))
    applied = sum(1 for v in apply.values() if v)
    return applied, len(apply) - applied


def read_json(path: Path) -> dict:
    """A JSON object of the work directory, or {} where it is missing, torn or not an
    object."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


ENTRY_FIELDS = ("name", "weight", "trials", "untuned_ms")  # what every state entry holds


def read_state(work: Path) -> dict:
    """Each tuned kernel's trials, times and verdicts (``paragraph-tune.json``) as measured by
    these versions (`cost_versions`, which each entry records): an entry another version
    wrote, or one torn or of another format, is left out, so that kernel is compared (and
    checked in the model) again; its trials are still counted in the database. A lost file
    is rebuilt the same way."""
    here = cost_versions()
    return {k: e for k, e in read_json(work / STATE_FILE).items()
            if isinstance(e, dict) and e.get("versions") == here
            and all(f in e for f in ENTRY_FIELDS)}
