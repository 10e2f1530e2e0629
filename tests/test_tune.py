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
from paragraph.cli import main
from paragraph.timing import MARGIN as MIN_GAIN
from paragraph.tvm_interop import random_inputs
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.build.tuning_db import (
    APPLIED,
    MODEL_FILE,
    RECORDS,
    STATE_FILE,
    tuning_id,
    write_applied,
)
from paragraph.tvm_interop.runtime.vm import run_vm

ARGS = ["tune", "squeezenet1_1", "--reduced", "--trials", "2", "--max-tasks", "2"]
TUNE = [sys.executable, "-m", "paragraph", *ARGS]


def _tune(capsys, *args: str) -> tuple[int, str]:
    """``paragraph tune`` in this process: MetaSchedule's first TuneContext imports every
    tensor intrinsic (~25 s on 2 cores), so the tuning tests pay that once, not per run."""
    capsys.readouterr()
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


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


def test_tuning_resumes_after_a_kill(tmp_path, capsys):
    work = tmp_path / "tuning"
    first = _tune_until_first_task(work)
    assert any("[1/2]" in line and "done in" in line for line in first), "\n".join(first)
    state = json.loads((work / STATE_FILE).read_text())
    assert len(state) == 1 and next(iter(state.values()))["trials"] >= 2
    # a kill can also tear the record being appended: the resumed run drops that line
    with open(work / RECORDS, "a") as f:
        f.write('[0, [[["GetSBlock", [], ["pad')
    code, out = _tune(capsys, *ARGS, "--work-dir", str(work))
    assert code == 0, out
    assert "dropping a torn line" in out
    assert "[1/2]" in out and "already has" in out and "skipping" in out
    assert "[2/2]" in out and "tuning 2 trials" in out
    assert "untuned us" in out and "tuned kernels in the model" in out  # the summary table
    state = json.loads((work / STATE_FILE).read_text())
    assert len(state) == 2 and all(e["trials"] >= 2 and e["untuned_ms"] > 0
                                   for e in state.values())
    assert all(e["faster"] == (e["tuned_ms"] is not None
                               and e["tuned_ms"] < e["untuned_ms"] * (1 - MIN_GAIN))
               for e in state.values())
    assert "tuned forms faster alone" in out and "model check" in out
    # the model check: applied only kernels faster alone, and only a set that ran the model
    # faster end to end than untuned, side by side (none where no set did)
    applied = {k for k, e in state.items() if e["applied"]}
    assert applied <= {k for k, e in state.items() if e["faster"]}
    if any(e["faster"] for e in state.values()):
        check = json.loads((work / MODEL_FILE).read_text())
        assert check["sizes"][-1] == 0 and len(check["ms"]) == 1
        row = check["ms"][0]
        assert set(check["kept"]) == applied
        if applied:
            j = check["sizes"].index(len(applied))
            assert row[j] < row[-1] * (1 - MIN_GAIN) and row[j] == min(row)
        else:
            assert min(row[:-1]) >= row[-1] * (1 - MIN_GAIN)
    for line in (work / RECORDS).read_text().splitlines():
        json.loads(line)  # every record line is whole again

    # a third run has nothing left to do
    code, again = _tune(capsys, *ARGS, "--work-dir", str(work))
    assert code == 0 and again.count("skipping") == 2, again
    assert "timing the model" not in again  # nor a model check already measured

    # --tuning-db applies the records of the kernels whose tuned form measured faster, and
    # only those: the tuned kernels change, the others and the outputs do not
    mod = models.get("squeezenet1_1", reduced=True)
    inputs = random_inputs(mod, seed=5)
    plain = build_program(mod, "llvm")
    names = {e["name"] for e in state.values()}

    def changed(tuned):
        return {n for n in names
                if not tvm_ffi.structural_equal(tuned.lowered[n], plain.lowered[n])}

    tuned = build_program(mod, "llvm", tuning_db=work)
    assert changed(tuned) == {e["name"] for e in state.values() if e["applied"]}
    for got, want in zip(run_vm(tuned.vm(), inputs), run_vm(plain.vm(), inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # every kernel applied, then none: the verdicts decide what lowering applies
    write_applied(work, {k: True for k in state})
    assert changed(build_program(mod, "llvm", tuning_db=work)) == names
    all_applied = tuning_id(work)
    write_applied(work, {k: False for k in state})
    assert changed(build_program(mod, "llvm", tuning_db=work)) == set()
    assert (work / APPLIED / RECORDS).read_text() == ""
    # cost-cache identity: the records applied, not the path
    assert tuning_id(None) == "" and all_applied.startswith("ms:")
    assert tuning_id(work) != all_applied


def test_tune_with_a_search_tunes_the_searched_graph_and_the_original(tmp_path, capsys):
    code, out = _tune(capsys, "tune", "squeezenet1_1", "--reduced", "--trials", "1",
                      "--max-tasks", "1", "--search", "greedy", "--search-budget", "5",
                      "--top-k", "1", "--work-dir", str(tmp_path / "w"),
                      "--json", str(tmp_path / "t.json"))
    assert code == 0, out
    assert "greedy substitution search" in out
    assert "as the greedy search rewrote it (tvm kernels)" in out
    assert out.count("tuned kernels in the model") == 2
    assert (tmp_path / "w" / APPLIED / RECORDS).exists()
    tuned = json.loads((tmp_path / "t.json").read_text())["tuned"]
    assert len(tuned) == 2 and all(len(rs) == 1 and "applied" in rs[0] for rs in tuned.values())
    check = json.loads((tmp_path / "t.json").read_text())["model_check"]
    assert check["schedule"] == "critical-path"
    assert not check["ms"] or len(check["ms"]) == 2  # both models checked, or nothing faster
