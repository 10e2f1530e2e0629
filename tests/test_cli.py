"""The ``paragraph`` command: every verb on small models, and clear errors on bad input."""

import json
import subprocess
import sys

import pytest

from paragraph import models
from paragraph.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_module_entry_point_lists_models():
    out = subprocess.run([sys.executable, "-m", "paragraph", "models"], capture_output=True,
                         text=True, check=True).stdout
    for name in models.list():
        assert name in out
    assert "1x3x299x299" in out and "1x3x75x75" in out


def test_run_checks_outputs_and_times(capsys):
    code, out, _ = run_cli(capsys, "run", "squeezenet1_1", "--reduced", "--repeat", "3",
                           "--schedule", "nimble")
    assert code == 0
    assert "against the numpy interpreter: max abs difference" in out and ": equal" in out
    assert "median" in out and "nimble schedule" in out
    assert "memory:" in out


def test_default_kernels_are_the_fastest_source(capsys, monkeypatch):
    """Without --kernels a user gets vendor kernels where torch is installed (untuned TVM CPU
    kernels are 10-100x slower), auto with a tuning database, TVM's own without torch; `tune`
    keeps tuning TVM's kernels. Without --schedule, critical-path."""
    from paragraph.tvm_interop.runtime.library import torch_kernels as runtime

    assert runtime.default_kernels("cpu") == "vendor"
    assert runtime.default_kernels("cpu", "some/db") == "auto"
    code, out, _ = run_cli(capsys, "run", "squeezenet1_1", "--reduced", "--repeat", "2")
    assert code == 0 and "vendor kernels" in out and "vendor kernels: median" in out
    assert "critical-path schedule" in out  # the default schedule: the fastest planner
    monkeypatch.setattr(runtime, "torch_available", lambda: False)
    assert runtime.default_kernels("cpu", "some/db") == "tvm"
    assert runtime.default_kernels("cuda") == "tvm"


def test_saved_schedule_runs_again(capsys, tmp_path):
    path = tmp_path / "sched.json"
    code, _, _ = run_cli(capsys, "run", "squeezenet1_1", "--reduced", "--repeat", "1",
                         "--schedule", "opara", "--save-schedule", str(path))
    assert code == 0 and json.loads(path.read_text())["name"] == "opara"
    code, out, _ = run_cli(capsys, "run", "squeezenet1_1", "--reduced", "--repeat", "1",
                           "--schedule-file", str(path))
    assert code == 0 and "opara schedule" in out
    code, _, err = run_cli(capsys, "run", "resnet50", "--reduced", "--repeat", "1",
                           "--schedule-file", str(path))
    assert code == 2 and "different kernel graph" in err


def test_bench_writes_json(capsys, tmp_path):
    path = tmp_path / "bench.json"
    code, out, _ = run_cli(capsys, "bench", "squeezenet1_1", "--reduced", "--repeat", "3",
                           "--schedules", "sequential,wavefront", "--json", str(path))
    assert code == 0 and "executor:wavefront" in out
    result = json.loads(path.read_text())
    names = [c["config"] for c in result["configs"]]
    assert names == ["tvm_vm", "tvm_compile_default", "executor:sequential",
                     "executor:wavefront"]
    for c in result["configs"]:
        assert {"config", "median_ms", "p10_ms", "p90_ms", "speedup_vs_tvm_vm"} <= set(c)
        assert c["p10_ms"] <= c["median_ms"] <= c["p90_ms"]
    assert result["configs"][0]["speedup_vs_tvm_vm"] == 1.0
    assert result["machine"]["versions"]["apache-tvm"] == "0.27.0.post1"
    assert "llvm" in result["target"]


def test_inspect_draws_a_timeline(capsys, tmp_path):
    png, dot = tmp_path / "t.png", tmp_path / "g.dot"
    code, out, _ = run_cli(capsys, "inspect", "squeezenet1_1", "--reduced", "--schedule",
                           "nimble", "--out", str(png), "--dot", str(dot))
    assert code == 0 and "average concurrency" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert dot.read_text().startswith("digraph")


def test_critical_path_splits_lone_convolutions_unless_told_not_to(capsys, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setenv("PARAGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    args = ("run", "inception_v3", "--reduced", "--repeat", "1", "--schedule", "critical-path")
    code, out, _ = run_cli(capsys, *args)
    assert code == 0  # outputs checked against the VM of the model's own program
    # the split is tried only where streams were kept (timed, so host-dependent: on a Zen 3
    # with the own AVX2 convolutions one stream of both cores won); either way it is said
    if "one stream: no lone convolution split" not in out:
        assert "into 2 on output channels" in out and "critical-path end to end" in out
    code, out, _ = run_cli(capsys, *args, "--no-split")
    # the pools moved after their 1 x 1 convolutions are still timed against the model as is
    assert code == 0 and "output channels" not in out and "split program" not in out
    assert "pools moved" in out


QUICK_IOS = ("--ios-protocol", "0,1,1")  # one run per stage: tests check wiring, not speed


def test_ios_in_run_bench_and_inspect(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PARAGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    code, out, _ = run_cli(capsys, "run", "squeezenet1_1", "--reduced", "--repeat", "1",
                           "--schedule", "ios", "--ios-mode", "parallel", "--ios-r", "2",
                           "--ios-s", "4", *QUICK_IOS)
    assert code == 0 and "ios-parallel schedule" in out and "equal" in out
    assert "IOS parts [####################]" in out and "stages measured" in out
    assert (tmp_path / "cache" / "costs.sqlite").exists()
    path = tmp_path / "bench.json"
    code, out, _ = run_cli(capsys, "bench", "squeezenet1_1", "--reduced", "--repeat", "2",
                           "--schedules", "sequential,ios-merge,ios-both", "--json",
                           str(path), *QUICK_IOS)
    assert code == 0, out
    rows = {c["config"]: c for c in json.loads(path.read_text())["configs"]}
    assert {"executor:ios-merge", "executor:ios-both"} <= set(rows)
    assert rows["executor:ios-both"]["search_s"] > 0
    assert "states" in rows["executor:ios-both"]["search"]
    png = tmp_path / "ios.png"
    code, out, _ = run_cli(capsys, "inspect", "squeezenet1_1", "--reduced", "--schedule",
                           "ios", "--out", str(png), *QUICK_IOS)
    assert code == 0 and png.exists() and "ios-both" in out
    artifact = tmp_path / "squeezenet.paragraph"
    code, _, _ = run_cli(capsys, "compile", "squeezenet1_1", "--reduced", "--schedule", "ios",
                         "-o", str(artifact), *QUICK_IOS)
    assert code == 0 and artifact.is_file()
    code, out, _ = run_cli(capsys, "run", str(artifact), "--repeat", "1", "--json",
                           str(tmp_path / "run.json"))
    assert code == 0 and "ios-both schedule" in out
    assert "at build: outputs against the numpy interpreter on 3 seeded input(s)" in out
    result = json.loads((tmp_path / "run.json").read_text())
    assert result["equal"] and result["median_ms"] > 0 and result["schedule"]["name"] == \
        "ios-both" and result["machine"]["cores"] >= 1
    code, out, _ = run_cli(capsys, "inspect", str(artifact), "--out", str(tmp_path / "a.png"),
                           "--json", str(tmp_path / "inspect.json"))
    assert code == 0 and "input x: float32[1, 3, 32, 32]" in out and (tmp_path / "a.png").exists()
    inspected = json.loads((tmp_path / "inspect.json").read_text())
    assert inspected["manifest"]["format"] == "paragraph-artifact"
    assert inspected["median_run_ms"] > 0


def test_ios_protocol_is_checked():
    with pytest.raises(SystemExit) as info:
        main(["run", "squeezenet1_1", "--schedule", "ios", "--ios-protocol", "2,six,6"])
    assert info.value.code == 2


def test_run_an_onnx_file(capsys, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                              torch.nn.Linear(4, 5))
    path = tmp_path / "tiny.onnx"
    torch.onnx.export(net.eval(), (torch.randn(1, 3, 8, 8),), str(path), dynamo=False,
                      input_names=["image"], dynamic_axes={"image": {0: "batch"}})
    code, _, err = run_cli(capsys, "run", str(path), "--repeat", "1")
    assert code == 2 and "'image' is dynamic" in err
    code, out, _ = run_cli(capsys, "run", str(path), "--repeat", "1", "--input-shape",
                           "image:2,3,8,8", "--schedule", "wavefront")
    assert code == 0 and "equal" in out


@pytest.mark.parametrize("argv,message", [
    (["run", "no_such_model"], "unknown model 'no_such_model'"),
    (["run", "missing.onnx"], "no such file"),
    (["run", "squeezenet1_1", "--input-shape", "x=1,2"], "expected NAME:D1,D2"),
    (["run", "squeezenet1_1", "--reduced", "--target", "cuda"], "no CUDA GPU"),
    (["bench", "squeezenet1_1", "--reduced", "--schedules", "fastest"], "unknown schedule"),
])
def test_errors_are_clear(capsys, argv, message):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_corrupt_schedule_file(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    code, _, err = run_cli(capsys, "run", "squeezenet1_1", "--reduced", "--schedule-file",
                           str(bad))
    assert code == 2 and "corrupt schedule" in err


def test_argument_errors_exit_cleanly():
    with pytest.raises(SystemExit) as info:
        main(["run", "squeezenet1_1", "--repeat", "0"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:  # 0 is allowed: the search without its loop
        main(["run", "squeezenet1_1", "--search", "taso", "--top-k", "-1"])
    assert info.value.code == 2


def test_search_rewrites_checks_and_is_never_slower(capsys, tmp_path, monkeypatch):
    # AutoGraph's on-board loop on a reduced model: candidates built, timed beside the input,
    # outputs checked against the model; the result is the input or measured faster than it
    monkeypatch.setenv("PARAGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    code, out, _ = run_cli(capsys, "run", "squeezenet1_1", "--reduced", "--search", "taso",
                           "--search-budget", "6", "--top-k", "2", "--threads", "2")
    assert code == 0
    assert "taso substitution search" in out and "candidates built" in out
    assert "measuring" in out and "new kernel signatures" in out
    assert ": equal" in out
    line = next(ln for ln in out.splitlines() if "measured" in ln and "->" in ln)
    before, after = (float(x.split()[0]) for x in line.split("measured ")[1].split(" -> "))
    assert after <= before
    # bench times the searched program beside the schedules; --alpha is TASO's name for beta
    path = tmp_path / "bench.json"
    code, out, _ = run_cli(capsys, "bench", "squeezenet1_1", "--reduced", "--schedules",
                           "sequential", "--search", "greedy", "--alpha", "1.05",
                           "--search-budget", "4", "--top-k", "1", "--repeat", "2",
                           "--json", str(path))
    assert code == 0, out
    rows = {c["config"]: c for c in json.loads(path.read_text())["configs"]}
    searched = rows["search:greedy+critical-path"]
    assert searched["search"]["beta"] == 1.05 and searched["search"]["candidates_built"] >= 1
    code, _, err = run_cli(capsys, "run", "squeezenet1_1", "--reduced", "--search", "taso",
                           "--beta", "0.9")
    assert code != 0 and "beta 0.9" in err


def test_a_damaged_artifact_is_named_as_one(capsys, tmp_path):
    path = tmp_path / "model.paragraph"
    path.write_bytes(b"PK\x03\x04 not really")
    for verb in ("run", "inspect"):
        code, _, err = run_cli(capsys, verb, str(path))
        assert code == 2 and "is not a paragraph artifact, or it is truncated or damaged" in err


def test_target_takes_what_tvm_takes(capsys, tmp_path):
    """--target: cpu, a kind, TVM's JSON form (TVM 0.27 refuses "llvm -mcpu=..." strings: the
    error says what to write instead), or a tag of a machine that is not this one, whose
    program is compiled with TVM's kernels and a schedule that needs no measurement, into a
    file this machine refuses to run."""
    import tvm

    cpu = tvm.target.codegen.llvm_get_system_cpu()
    code, out, _ = run_cli(capsys, "run", "squeezenet1_1", "--reduced", "--repeat", "1",
                           "--schedule", "wavefront", "--target",
                           json.dumps({"kind": "llvm", "mcpu": cpu, "num-cores": 2}))
    assert code == 0 and "equal" in out
    code, _, err = run_cli(capsys, "run", "squeezenet1_1", "--reduced",
                           "--target", "llvm -mcpu=znver4")
    assert code == 2 and "JSON form" in err and "Traceback" not in err
    code, _, err = run_cli(capsys, "run", "squeezenet1_1", "--reduced", "--target", "{oops")
    assert code == 2 and "not valid JSON" in err
    if tvm.cuda(0).exist:
        return  # the tag's machine is this one
    artifact = tmp_path / "h100.paragraph"
    code, out, _ = run_cli(capsys, "compile", "squeezenet1_1", "--reduced", "--target",
                           "nvidia/nvidia-h100", "-o", str(artifact))
    assert code == 0, out
    assert "does not run on this machine: planning the opara schedule" in out
    assert "tvm kernels" in out and artifact.is_file()
    code, _, err = run_cli(capsys, "run", str(artifact))
    assert code == 2 and "Traceback" not in err
    code, _, err = run_cli(capsys, "compile", "squeezenet1_1", "--reduced", "--target",
                           "nvidia/nvidia-h100", "--schedule", "critical-path", "-o",
                           str(artifact))
    assert code == 2 and "--rpc-tracker" in err and "needs no measurement" in err


def test_inputs_and_outputs_files(capsys, tmp_path):
    """run --inputs x.npz (by name, or in order) --outputs y.npz, as tvmc does; a file that
    does not fit the model is a clear error."""
    import numpy as np

    from paragraph.tvm_interop import from_relax, random_inputs

    mod = models.get("squeezenet1_1", reduced=True)
    (x,) = random_inputs(mod, seed=3)
    graph = from_relax(mod)
    name = graph[graph.inputs[0]].name
    inputs, outputs = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(inputs, **{name: x})
    code, out, _ = run_cli(capsys, "run", "squeezenet1_1", "--reduced", "--repeat", "1",
                           "--schedule", "sequential", "--inputs", str(inputs), "--outputs",
                           str(outputs))
    assert code == 0 and "equal" in out and "wrote 1 output(s)" in out
    with np.load(outputs) as got:
        first = got["output_0"]
    np.savez(inputs, x)  # in order: arr_0
    code, _, _ = run_cli(capsys, "run", "squeezenet1_1", "--reduced", "--repeat", "1",
                         "--schedule", "sequential", "--inputs", str(inputs), "--outputs",
                         str(outputs))
    with np.load(outputs) as again:
        # the same inputs (a kernel's first calls may run another of its forms: rounding)
        np.testing.assert_allclose(again["output_0"], first, rtol=1e-5, atol=1e-6)
    np.savez(inputs, x[:, :1])
    code, _, err = run_cli(capsys, "run", "squeezenet1_1", "--reduced", "--inputs",
                           str(inputs))
    assert code == 2 and f"input {name!r} takes float32" in err
    np.savez(inputs, a=x, b=x)
    code, _, err = run_cli(capsys, "run", "squeezenet1_1", "--reduced", "--inputs",
                           str(inputs))
    assert code == 2 and "the model takes 1 input(s)" in err


def _one_error_line(err: str) -> str:
    """The error output holds one line (after the blank one that ends a progress line)."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("paragraph: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_bad_model_files_are_one_line(capsys, tmp_path):
    pytest.importorskip("onnx")
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07\x12\x04junk" + bytes(range(256)) * 4)
    code, _, err = run_cli(capsys, "run", str(corrupt))
    assert code == 2 and "ONNX" in _one_error_line(err) and str(corrupt) in err
    folder = tmp_path / "folder.onnx"
    folder.mkdir()
    code, _, err = run_cli(capsys, "run", str(folder))
    assert code == 2 and "is a directory" in _one_error_line(err)
    code, _, err = run_cli(capsys, "run", str(tmp_path / "nowhere" / "model.onnx"))
    assert code == 2 and "no such file" in _one_error_line(err)


def test_an_output_that_cannot_be_written_is_one_line(capsys, unwritable_dir):
    out = unwritable_dir / "out.npz"
    code, stdout, err = run_cli(capsys, "run", "squeezenet1_1", "--reduced", "--repeat", "1",
                                "--schedule", "sequential", "--outputs", str(out))
    assert code == 2 and ": equal" in stdout  # the run itself went well
    line = _one_error_line(err)
    assert line.startswith(f"paragraph: error: cannot write {out}: ")
    assert line.endswith(("Permission denied", "Not a directory", "Read-only file system"))


def test_debug_prints_the_traceback_before_or_after_the_verb(capsys, tmp_path):
    missing = str(tmp_path / "missing.onnx")
    for argv in (["--debug", "run", missing], ["run", missing, "--debug"]):
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and "Traceback (most recent call last)" in err
        assert err.rstrip().splitlines()[-1].startswith("paragraph: error: ")
        assert "no such file" in err
    code, _, err = run_cli(capsys, "run", missing)
    assert "Traceback" not in err


def test_any_exception_is_one_line_naming_its_kind(capsys, monkeypatch):
    """Out of memory (with the step it happened in), a file error, an error inside TVM and
    paragraph's own bug each end as one line and exit status 2; Ctrl+C as 130."""
    import tvm

    import paragraph.cli as cli

    def load(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(cli, "load_model", load)
    code, _, err = run_cli(capsys, "run", "squeezenet1_1", "--reduced")
    assert code == 2
    assert _one_error_line(err) == ("paragraph: error: out of memory while importing "
                                    "squeezenet1_1")

    def tvm_fails(*args, **kwargs):
        tvm.target.Target("llvm -mcpu=nothing")  # TVM's own error, from its C++

    monkeypatch.setattr(cli, "load_model", tvm_fails)
    code, _, err = run_cli(capsys, "run", "squeezenet1_1", "--reduced")
    line = _one_error_line(err)
    assert code == 2 and "TVM failed while importing squeezenet1_1 (ValueError)" in line
    assert "--debug" in line

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "load_model", interrupted)
    code, _, err = run_cli(capsys, "run", "squeezenet1_1", "--reduced")
    assert code == 130 and err.strip() == "paragraph: interrupted"


def test_describe_names_each_kind():
    import errno
    import sqlite3

    from paragraph.errors import describe

    assert describe(PermissionError(errno.EACCES, "Permission denied", "/x")) == \
        "cannot access /x: Permission denied"
    assert describe(OSError(errno.ENOSPC, "No space left on device")) == \
        "system error (OSError): No space left on device"
    assert describe(MemoryError()) == "out of memory"
    assert describe(sqlite3.OperationalError("database is locked")).startswith(
        "internal error (OperationalError): database is locked")
    assert describe(RuntimeError("first\nsecond")).startswith("internal error (RuntimeError): "
                                                             "first (rerun with --debug")


def test_the_rpc_server_entry_point_reports_one_line(capsys):
    from paragraph.tvm_interop.meter.remote import main as serve_main

    assert serve_main(["--tracker", "localhost:port", "--key", "k"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "paragraph-rpc-server: error: expected HOST:PORT, got 'localhost:port'"


def test_a_ctrl_c_tvm_disguised_is_still_an_interrupt(capsys):
    """A Ctrl+C landing in TVM's C++ comes back as an empty RuntimeError, maybe wrapped in
    paragraph's own error: the command line still says "interrupted", status 130."""
    from paragraph.errors import UnsupportedModelError, exit_status, reraise_interrupt

    def disguised() -> int:
        raise RuntimeError()

    def wrapped() -> int:
        try:
            disguised()
        except RuntimeError as e:
            raise UnsupportedModelError("m.onnx: TVM's ONNX frontend failed: RuntimeError: ") \
                from e
        return 0

    for command in (disguised, wrapped):
        assert exit_status(command) == 130
        assert capsys.readouterr().err.strip() == "paragraph: interrupted"
    with pytest.raises(KeyboardInterrupt):
        reraise_interrupt(RuntimeError())
    reraise_interrupt(RuntimeError("a real failure"))  # not an interrupt: nothing raised
