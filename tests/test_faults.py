"""Faults: a database another process holds, a truncated or foreign one, a cache directory that
cannot be written, a full disk, a kernel that raises, Ctrl+C in a search. Each ends as one
clear line or one warning, leaves every cache valid and loses no finished measurement."""

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import warnings

import pytest
import tvm

from paragraph.errors import CacheError
from paragraph.timing import Timing
from paragraph.tvm_interop.measure.costdb import TABLE, CostDB, CostKey, cost_versions

# A second process that takes the database's exclusive lock, says so, and gives it back after
# argv[2] seconds (or, with "stdin", when a line arrives on its standard input).
LOCKER = textwrap.dedent("""
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    print("locked", flush=True)
    if sys.argv[2] == "stdin":
        sys.stdin.readline()
    else:
        time.sleep(float(sys.argv[2]))
    conn.execute("COMMIT")
    print("released", flush=True)
""")


TVM_LOG = re.compile(r"\[\d\d:\d\d:\d\d\] \S+\.(cc|h):\d+: ")  # TVM's C++ logging


def locked_by_another_process(path, hold: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", LOCKER, str(path), hold], text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline().strip() == "locked"
    return child


def stored(path) -> dict[str, float]:
    """kernel -> median of every cost in the file, read as any SQLite client would, after
    checking the file's integrity."""
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return dict(conn.execute(f"SELECT kernel, median FROM {TABLE}").fetchall())
    finally:
        conn.close()


def test_a_lock_held_for_a_moment_is_waited_for(tmp_path):
    path = tmp_path / "costs.sqlite"
    db = CostDB(path)
    db.put(CostKey("llvm", "a"), Timing((1.0,)))
    db.close()
    child = locked_by_another_process(path, "0.7")
    db = CostDB(path, retry_s=10)  # opening reads the file: it waits for the lock
    assert db.get(CostKey("llvm", "a")) == 1.0
    assert child.wait(10) == 0
    child = locked_by_another_process(path, "0.7")
    db.put(CostKey("llvm", "b"), Timing((2.0,)))  # so does writing
    assert child.wait(10) == 0
    assert db.get(CostKey("llvm", "b")) == 2.0
    db.close()
    assert stored(path) == {"a": 1.0, "b": 2.0}
    assert [p.name for p in tmp_path.iterdir()] == ["costs.sqlite"]


def test_a_lock_held_past_the_retries_is_one_clear_error_and_the_file_stays(tmp_path):
    path = tmp_path / "costs.sqlite"
    db = CostDB(path, retry_s=0.5)
    db.put(CostKey("llvm", "a"), Timing((1.0,)))
    child = locked_by_another_process(path, "stdin")
    try:
        with pytest.raises(CacheError, match="stayed locked by another process for 0.5 s"):
            CostDB(path, retry_s=0.5)
        with pytest.raises(CacheError, match="stayed locked") as info:
            db.put(CostKey("llvm", "b"), Timing((2.0,)))
        assert "\n" not in str(info.value) and str(path) in str(info.value)
        with pytest.raises(CacheError, match="stayed locked"):
            db.get(CostKey("llvm", "a"))
    finally:
        child.communicate("go\n", timeout=10)
    assert db.get(CostKey("llvm", "a")) == 1.0  # usable again once the lock is given back
    db.close()
    assert stored(path) == {"a": 1.0}
    assert [p.name for p in tmp_path.iterdir()] == ["costs.sqlite"]  # nothing moved aside


def test_a_database_truncated_mid_write_is_moved_aside_with_its_new_name(tmp_path):
    path = tmp_path / "costs.sqlite"
    db = CostDB(path)
    db.close()
    conn = sqlite3.connect(path)
    rows = [(cost_versions(), "llvm", f"kernel-{i:05d}" * 4, "", "tvm", "", 1.0, 1.0, 1.0, 1,
             0.0) for i in range(2000)]
    conn.executemany(f"INSERT INTO {TABLE} VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
    conn.commit()
    conn.close()
    whole = path.read_bytes()
    path.write_bytes(whole[:len(whole) // 2])  # the first half, as a write cut off leaves it
    with pytest.warns(RuntimeWarning) as caught:
        db = CostDB(path)
    (aside,) = [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    (message,) = [str(w.message) for w in caught]
    assert "damaged (database disk image is malformed)" in message
    assert f"moved it to {aside}" in message
    assert aside.read_bytes() == whole[:len(whole) // 2]
    db.put(CostKey("llvm", "k"), Timing((1.0,)))
    assert len(db) == 1
    db.close()
    assert stored(path) == {"k": 1.0}


def test_costs_measured_by_other_versions_are_misses(tmp_path):
    path = tmp_path / "costs.sqlite"
    assert f"tvm {tvm.__version__}" in cost_versions() and "paragraph " in cost_versions()
    old = CostDB(path, versions="paragraph 0.0.1; tvm 0.19.0")
    old.put(CostKey("llvm", "k"), Timing((5.0,)))
    old.close()
    db = CostDB(path)
    assert db.get(CostKey("llvm", "k")) is None and len(db) == 0
    db.put(CostKey("llvm", "k"), Timing((1.0,)))
    db.close()
    again = CostDB(path, versions="paragraph 0.0.1; tvm 0.19.0")
    assert again.get(CostKey("llvm", "k")) == 5.0  # the other version's cost is still there
    again.close()


def test_an_unwritable_cache_directory_keeps_this_runs_costs_in_memory(
        unwritable_dir, monkeypatch):
    monkeypatch.setenv("PARAGRAPH_CACHE_DIR", str(unwritable_dir))
    with pytest.warns(RuntimeWarning, match="cannot be written .*kept in memory") as caught:
        db = CostDB()
        db.put(CostKey("llvm", "k"), Timing((1.0,)))
        again = CostDB()  # the same file again: no second warning
    assert len(caught) == 1
    assert db.get(CostKey("llvm", "k")) == 1.0 and len(db) == 1
    assert again.get(CostKey("llvm", "k")) is None  # memory is per database object
    assert not (unwritable_dir / "costs.sqlite").exists()


# The cost database in a directory of mode 0555, in a child process that the mode stops (for
# root: one without the capabilities that let root write anyway).
READ_ONLY = textwrap.dedent("""
    import json, os, sys, warnings
    from pathlib import Path
    from paragraph.timing import Timing
    from paragraph.tvm_interop.measure.costdb import CostDB, CostKey
    path = Path(sys.argv[1])
    try:
        (path.parent / "probe").touch()
        sys.exit("the directory can still be written")
    except PermissionError:
        pass
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        db = CostDB(path)
        db.put(CostKey("llvm", "b"), Timing((2.0,)))
        db.put(CostKey("llvm", "c"), Timing((3.0,)))
    print(json.dumps({"a": db.get(CostKey("llvm", "a")), "b": db.get(CostKey("llvm", "b")),
                      "count": len(db), "warnings": [str(w.message) for w in caught]}))
""")


def test_an_existing_database_in_a_read_only_directory_is_read(tmp_path):
    drop = []  # what keeps root from writing where the mode says no
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root writes to a mode 0555 directory, and setpriv (util-linux), "
                        "which drops the capabilities that let it, is not installed")
        drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    path = tmp_path / "ro" / "costs.sqlite"
    db = CostDB(path)
    db.put(CostKey("llvm", "a"), Timing((1.0,)))
    db.close()
    path.parent.chmod(0o555)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        done = subprocess.run([*drop, sys.executable, "-c", READ_ONLY, str(path)], env=env,
                              capture_output=True, text=True, timeout=120)
    finally:
        path.parent.chmod(0o755)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["a"] == 1.0 and seen["b"] == 2.0 and seen["count"] == 3
    (warning,) = seen["warnings"]
    assert "cannot be written" in warning and "what it holds is still used" in warning
    assert stored(path) == {"a": 1.0}


# The cost database on a disk that takes no more bytes: RLIMIT_FSIZE stops every write past
# 1 KiB (the file already holds more), as a full disk does, for root too.
FULL_DISK = textwrap.dedent("""
    import json, resource, signal, sys, warnings
    from paragraph.timing import Timing
    from paragraph.tvm_interop.measure.costdb import CostDB, CostKey
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        db = CostDB(sys.argv[1], retry_s=0.3)
        db.put(CostKey("llvm", "new"), Timing((2.0,)))
        db.put(CostKey("llvm", "newer"), Timing((3.0,)))
    print(json.dumps({"old": db.get(CostKey("llvm", "old")),
                      "new": db.get(CostKey("llvm", "new")), "count": len(db),
                      "warnings": [str(w.message) for w in caught]}))
""")


def test_a_full_disk_keeps_what_is_stored_and_measures_on_in_memory(tmp_path):
    path = tmp_path / "costs.sqlite"
    db = CostDB(path)
    db.put(CostKey("llvm", "old"), Timing((1.0,)))
    db.close()
    assert path.stat().st_size > 1024
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(path)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["old"] == 1.0 and seen["new"] == 2.0 and seen["count"] == 3
    (warning,) = seen["warnings"]
    assert "cannot be written" in warning and "kept in memory" in warning
    assert stored(path) == {"old": 1.0}  # valid, and nothing already stored is lost
    assert [p.name for p in tmp_path.iterdir()] == ["costs.sqlite"]


def test_no_sqlite_error_escapes_get_or_put(tmp_path):
    """A database closed under a caller, or a file SQLite cannot use, is a `CacheError`."""
    db = CostDB(tmp_path / "costs.sqlite")
    db.close()
    with pytest.raises(CacheError, match="closed"):
        db.get(CostKey("llvm", "k"))
    with pytest.raises(CacheError, match="closed"):
        db.put(CostKey("llvm", "k"), Timing((1.0,)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (tmp_path / "dir.sqlite").mkdir()  # not a file at all: nothing to read or write
        with pytest.raises(RuntimeWarning, match="cannot be written"):
            CostDB(tmp_path / "dir.sqlite")


def test_errors_without_a_code_are_told_by_their_message():
    """Python 3.10's sqlite3 errors carry no SQLite code: the message tells the kind."""
    from paragraph.tvm_interop.measure.costdb import _code

    for message, code in (("database is locked", 5), ("database table is locked", 5),
                          ("disk I/O error", 10), ("database or disk is full", 13),
                          ("attempt to write a readonly database", 8),
                          ("unable to open database file", 14),
                          ("database disk image is malformed", 11),
                          ("file is not a database", 26), ("no such table: x", 1)):
        assert _code(sqlite3.OperationalError(message)) == code, message


def test_the_proof_cache_keys_z3_and_paragraph_and_survives_damage(fresh_cache, monkeypatch):
    """A cached proof is found again; one another z3 made, a torn file, or one written by
    another format is a miss (proved again and rewritten); paragraph's version is in the
    file's name."""
    from paragraph.rules import verify
    from paragraph.rules.library import default_library

    rule = default_library().get("taso-11f8ff3b")
    assert verify.prove_rule(rule).seconds > 0  # proved
    (path,) = (fresh_cache / "proofs").iterdir()
    assert verify.prove_rule(rule).seconds == 0.0  # found
    entry = json.loads(path.read_text())
    for damaged in (json.dumps({**entry, "z3": "4.8.0"}), path.read_text()[:20],
                    json.dumps({"status": "verified"}), "[]"):
        path.write_text(damaged)
        again = verify.prove_rule(rule)
        assert again.status == "verified" and again.seconds > 0, damaged
        assert json.loads(path.read_text()) == entry  # rewritten whole
    this_version = verify.Prover().file_key
    monkeypatch.setattr(verify, "__version__", "0.0.0-other")
    assert verify.Prover().file_key != this_version


def test_a_proof_cache_that_cannot_be_written_warns_once(unwritable_dir, monkeypatch):
    from paragraph.rules import verify
    from paragraph.rules.library import default_library

    monkeypatch.setenv("PARAGRAPH_CACHE_DIR", str(unwritable_dir))
    rules = default_library().rules[:3]
    with pytest.warns(RuntimeWarning, match="proofs are not cached .*cannot write") as caught:
        proofs = [verify.prove_rule(r) for r in rules]
    assert len(caught) == 1 and all(p.status == "verified" for p in proofs)


def test_tuning_state_of_another_version_or_torn_is_measured_again(tmp_path):
    from paragraph.tvm_interop.build.tuning_db import STATE_FILE, read_state

    entry = {"name": "fused_conv", "weight": 1, "trials": 4, "untuned_ms": 0.5,
             "tuned_ms": 0.4, "faster": True, "applied": True, "versions": cost_versions()}
    state = {"aa": entry, "bb": {**entry, "versions": "paragraph 0.0.1; tvm 0.19.0"},
             "cc": {k: v for k, v in entry.items() if k != "untuned_ms"}, "dd": [1, 2]}
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    assert read_state(tmp_path) == {"aa": entry}
    for damaged in (json.dumps(state)[:40], "[]", ""):
        (tmp_path / STATE_FILE).write_text(damaged)
        assert read_state(tmp_path) == {}


def test_a_tuning_database_that_cannot_be_written_is_one_line(tmp_path, unwritable_dir):
    from paragraph.errors import FileWriteError
    from paragraph.tvm_interop.build.tuning_db import RECORDS, WORKLOADS, write_applied

    (tmp_path / WORKLOADS).write_text('["123", {}]\n')
    (tmp_path / RECORDS).write_text('[0, {}]\n')
    with pytest.raises(FileWriteError, match=f"cannot write {unwritable_dir / WORKLOADS}: "):
        write_applied(tmp_path, {"000000000000007b": True}, out=unwritable_dir)
    assert write_applied(tmp_path, {"000000000000007b": True}, out=tmp_path / "ok") == (1, 0)
    assert (tmp_path / "ok" / RECORDS).read_text() == '[0, {}]\n'


# ---------------------------------------------------------------------------- a kernel fails
def test_a_kernel_that_raises_is_one_line_and_the_executable_runs_again(stream_runner):
    """A kernel raising in `ParallelExecutable.run` is one `KernelError` line naming it; the
    executable (its streams, workers, memory) serves the next run."""
    import numpy as np
    import tvm_ffi
    from tvm import relax

    from paragraph.deploy import ParallelExecutable
    from paragraph.passes.schedule import make_schedule
    from paragraph.tvm_interop.build.program import build_program
    from paragraph.tvm_interop.runtime.executor import KernelError

    failing = [True]

    def flaky(x, out):
        if failing[0]:
            raise ValueError("the device went away")
        out.copyfrom(x)

    tvm_ffi.register_global_func("paragraph_test.flaky", flaky, override=True)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.exp(x))
            b = bb.emit(relax.call_dps_packed("paragraph_test.flaky", (x,),
                                              relax.TensorType((4, 8), "float32")))
            out = bb.emit_output(relax.op.concat([a, b], axis=1))
        bb.emit_func_output(out)
    program = build_program(bb.get(), "llvm")
    data = np.arange(32, dtype="float32").reshape(4, 8) / 32
    with ParallelExecutable(program, make_schedule("wavefront", program.graph)) as exe:
        with pytest.raises(KernelError) as info:
            exe.run(data)
        message = str(info.value)
        assert "\n" not in message and "'paragraph_test.flaky'" in message
        assert "the device went away" in message
        failing[0] = False
        (got,) = exe.run(data)
        np.testing.assert_allclose(got, np.concatenate([np.exp(data), data], axis=1),
                                   rtol=1e-6)


# ---------------------------------------------------------------------------- Ctrl+C
def test_ctrl_c_in_a_search_is_one_line_and_keeps_the_finished_measurements(tmp_path):
    """``paragraph run --search`` interrupted (SIGINT) once it has stored measurements: exit
    status 130, one line, and the cost database valid, holding at least those."""
    import time

    from paragraph.files import cache_dir

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "native").symlink_to(cache_dir() / "native", target_is_directory=True)
    env = {**os.environ, "PARAGRAPH_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-m", "paragraph", "run", "squeezenet1_1", "--reduced", "--search",
         "taso", "--search-budget", "120", "--top-k", "8", "--threads", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
        # Ctrl+C's default in the child even where the suite runs with SIGINT ignored (a shell
        # without job control starts a background `make test` so: the child ran to the end)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    path, seen = cache / "costs.sqlite", 0
    try:
        deadline = time.monotonic() + 120
        # interrupted at its first stored measurements: with a few, the search had finished
        # before the signal once the builds got faster
        while seen < 1 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as conn:
                    seen = conn.execute(f"SELECT COUNT(*) FROM {TABLE}").fetchone()[0]
            except sqlite3.Error:
                seen = 0  # not created yet
        assert seen >= 1, "no measurements stored in time"
        assert child.poll() is None, "the search ended before it could be interrupted"
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 130, err
    # TVM's C++ logs to stderr itself when an interrupt unwinds a builder ("[04:28:38]
    # .../block_builder.cc:67: Warning: BlockBuilder destroyed with remaining blocks!")
    ours = [ln for ln in err.splitlines() if ln.strip() and not TVM_LOG.match(ln)]
    assert ours == ["paragraph: interrupted"], err
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute(f"SELECT COUNT(*) FROM {TABLE}").fetchone()[0] >= seen
    finally:
        conn.close()


# ---------------------------------------------------------------------------- the command line
def _half_a_database(path) -> None:
    """``path``: the first half of a real cost database, as a write cut off leaves it."""
    db = CostDB(path)
    db.close()
    conn = sqlite3.connect(path)
    conn.executemany(f"INSERT INTO {TABLE} VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                     [(cost_versions(), "llvm", f"k{i:05d}" * 8, "", "tvm", "", 1.0, 1.0, 1.0,
                       1, 0.0) for i in range(1500)])
    conn.commit()
    conn.close()
    whole = path.read_bytes()
    path.write_bytes(whole[:len(whole) // 2])


@pytest.mark.parametrize("fault", ["truncated", "other version", "unwritable", "locked"])
def test_the_command_line_over_a_faulty_cost_database(fault, capsys, tmp_path, monkeypatch,
                                                       unwritable_dir):
    """`paragraph run` with a damaged, foreign, unwritable or locked cost database: it runs
    with one warning line, or stops with one error line; the file is valid after."""
    from paragraph.cli import main
    from paragraph.tvm_interop.measure import costdb
    from paragraph.tvm_interop.runtime import native
    from paragraph.tvm_interop.runtime.library import native as kernels

    native.runner(), kernels.module()  # loaded from the suite's cache: none built in this one
    cache = unwritable_dir if fault == "unwritable" else tmp_path / "cache"
    monkeypatch.setenv("PARAGRAPH_CACHE_DIR", str(cache))
    monkeypatch.setattr(costdb, "RETRY_S", 0.5)
    path = cache / "costs.sqlite"
    child = None
    if fault == "truncated":
        cache.mkdir()
        _half_a_database(path)
    elif fault == "other version":
        other = CostDB(path, versions="paragraph 0.0.1; tvm 0.19.0")
        other.put(CostKey("llvm", "k"), Timing((1.0,)))
        other.close()
    elif fault == "locked":
        CostDB(path).close()
        child = locked_by_another_process(path, "stdin")
    try:
        code = main(["run", "squeezenet1_1", "--reduced", "--repeat", "1", "--schedule",
                     "sequential"])
    finally:
        if child is not None:
            child.communicate("go\n", timeout=10)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    if fault == "locked":
        assert code == 2 and len(err) == 1, err
        assert err[0].startswith(f"paragraph: error: the cost database {path} stayed locked "
                                 "by another process for 0.5 s")
    else:
        assert code == 0
        assert len(err) == (0 if fault == "other version" else 1), err
    if fault == "truncated":
        (aside,) = [p for p in path.parent.iterdir() if ".corrupt-" in p.name]
        assert err[0].startswith(f"paragraph: warning: cost database {path} was damaged")
        assert f"moved it to {aside}" in err[0]
    if fault == "unwritable":
        assert err[0].startswith(f"paragraph: warning: cost database {path} cannot be written")
        return
    assert [p.name for p in path.parent.iterdir() if p.name.startswith("costs.sqlite")
            and ".corrupt-" not in p.name] == ["costs.sqlite"]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    if fault == "other version":
        again = CostDB(path, versions="paragraph 0.0.1; tvm 0.19.0")
        assert again.get(CostKey("llvm", "k")) == 1.0
        again.close()


def _full_disk() -> None:
    """In the child before it runs: every write past 1 KiB fails (EFBIG), as on a full disk."""
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))


def test_the_command_line_on_a_full_disk(tmp_path):
    """`paragraph run --outputs` where no file can grow: the run goes on from the caches
    (read, not written), and the output that cannot be written is one error line."""
    from paragraph.files import cache_dir

    cache = tmp_path / "cache"
    db = CostDB(cache / "costs.sqlite")
    db.put(CostKey("llvm", "old"), Timing((1.0,)))
    db.close()
    (cache / "native").symlink_to(cache_dir() / "native", target_is_directory=True)
    out = tmp_path / "out.npz"
    env = {**os.environ, "PARAGRAPH_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-m", "paragraph", "run", "squeezenet1_1", "--reduced", "--repeat",
         "1", "--schedule", "sequential", "--outputs", str(out)], env=env, text=True,
        capture_output=True, preexec_fn=_full_disk, timeout=300)
    assert done.returncode == 2 and ": equal" in done.stdout, done.stdout + done.stderr
    ours = [ln for ln in done.stderr.splitlines() if ln.strip() and not TVM_LOG.match(ln)]
    assert ours == [f"paragraph: error: cannot write {out}: File too large"], done.stderr
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["cache"]
    assert stored(cache / "costs.sqlite") == {"old": 1.0}
