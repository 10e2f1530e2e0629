"""MetaSchedule tuning: a few trials on a reduced model, stopped by a kill and resumed; the
database applied through --tuning-db; its identity in cost keys."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import tvm_ffi

from paragraph import models
from paragraph.tvm_interop import random_inputs
from paragraph.tvm_interop.kernels import KernelProgram
from paragraph.tvm_interop.tune import RECORDS, STATE_FILE, tuning_id
from paragraph.tvm_interop.vm import run_vm

TUNE = [sys.executable, "-m", "paragraph", "tune", "squeezenet1_1", "--reduced",
        "--trials", "2", "--max-tasks", "2"]


def _tune_until_first_task(work: Path) -> list[str]:
    """Start a tuning run and kill it (SIGKILL: no chance to clean up) once a task is done."""
    proc = subprocess.Popen([*TUNE, "--work-dir", str(work)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=os.environ.copy())
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip())
            if "[1/2]" in line and "done in" in line:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    return lines


def test_tuning_resumes_after_a_kill(tmp_path):
    work = tmp_path / "tuning"
    first = _tune_until_first_task(work)
    assert any("[1/2]" in line and "done in" in line for line in first), "\n".join(first)
    state = json.loads((work / STATE_FILE).read_text())
    assert len(state) == 1 and next(iter(state.values()))["trials"] >= 2
    # a kill can also tear the record being appended: the resumed run drops that line
    with open(work / RECORDS, "a") as f:
        f.write('[0, [[["GetSBlock", [], ["pad')
    rerun = subprocess.run([*TUNE, "--work-dir", str(work)], capture_output=True, text=True,
                           timeout=900)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    out = rerun.stdout
    assert "dropping a torn line" in out
    assert "[1/2]" in out and "already has" in out and "skipping" in out
    assert "[2/2]" in out and "tuning 2 trials" in out
    assert "untuned ms" in out and "tuned kernels in the model" in out  # the summary table
    state = json.loads((work / STATE_FILE).read_text())
    assert len(state) == 2 and all(e["trials"] >= 2 and e["untuned_ms"] > 0
                                   for e in state.values())
    for line in (work / RECORDS).read_text().splitlines():
        json.loads(line)  # every record line is whole again

    # a third run has nothing left to do
    again = subprocess.run([*TUNE, "--work-dir", str(work)], capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0 and again.stdout.count("skipping") == 2, again.stdout

    # --tuning-db applies the records: the tuned kernels change, the outputs do not
    mod = models.get("squeezenet1_1", reduced=True)
    inputs = random_inputs(mod, seed=5)
    plain = KernelProgram.build(mod, "llvm")
    tuned = KernelProgram.build(mod, "llvm", tuning_db=work)
    valid = {e["name"] for e in state.values() if e["best_ms"] is not None}
    changed = {n for n in valid
               if not tvm_ffi.structural_equal(tuned.lowered[n], plain.lowered[n])}
    assert changed == valid  # a kernel with a measured record now has its tuned schedule
    for got, want in zip(run_vm(tuned.vm(), inputs), run_vm(plain.vm(), inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

    assert tuning_id(None) == "" and tuning_id(work).startswith("ms:")
    before = tuning_id(work)
    with open(work / RECORDS, "a") as f:
        f.write((work / RECORDS).read_text().splitlines()[0] + "\n")
    assert tuning_id(work) != before  # new records, new cost-cache identity
