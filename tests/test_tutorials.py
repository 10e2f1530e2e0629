"""The tutorials run as written (reduced models) and say what they claim."""

import re
import runpy
from pathlib import Path

import pytest
from conftest import with_native_libraries

TUTORIALS = Path(__file__).resolve().parent.parent / "tutorials"


def test_quickstart(capsys, fresh_cache):
    tutorial = runpy.run_path(str(TUTORIALS / "quickstart.py"))
    assert {"sequential", "critical-path", "ios"} <= set(tutorial["SCHEDULES"])
    schedules = ("sequential", "critical-path", "ios")  # the others: test_executor's
    tutorial["main"](schedules=schedules)
    out = capsys.readouterr().out
    assert "built: <ParallelExecutable" in out
    assert re.search(r"TVM VM: \d+\.\d+ ms a run", out)
    for name in schedules:  # each built, run, checked against the TVM VM and timed
        assert re.search(rf"schedule='{name}': .* kernels on \d+ stream\(s\)", out), name
    medians = re.findall(r"median (\d+\.\d+) ms, same outputs as the TVM VM", out)
    assert len(medians) == len(schedules) and all(float(m) > 0 for m in medians)
    assert f"schedules run: {', '.join(schedules)}" in out
    assert "exported inception.paragraph" in out
    assert re.search(r"loaded: critical-path: .*, same outputs, median \d+\.\d+ ms", out)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One fresh cache for these tutorials, with the native libraries built already."""
    return with_native_libraries(tmp_path_factory.mktemp("cache"))


def _run(name: str, capsys, cache, monkeypatch, **kwargs) -> str:
    monkeypatch.setenv("PARAGRAPH_CACHE_DIR", str(cache))
    runpy.run_path(str(TUTORIALS / f"{name}.py"))["main"](**kwargs)
    return capsys.readouterr().out


def test_custom_rule(capsys, cache, monkeypatch):
    out = _run("custom_rule", capsys, cache, monkeypatch, budget=10.0)
    assert "z3: verified" in out and "random instances agree" in out
    assert "squeezenet: 8 matches" in out and "same outputs" in out
    assert "the search applied" in out and "unverified: rule 'relu-after-concat'" in out


def test_tvm_compile_onnx(capsys, cache, monkeypatch):
    out = _run("tvm_compile_onnx", capsys, cache, monkeypatch)
    for line in ("TVM default build, VM:", "paragraph.pipeline(), VM:",
                 "paragraph.build, critical-path"):
        assert line in out


def test_deploy(capsys, cache, monkeypatch):
    out = _run("deploy", capsys, cache, monkeypatch)
    assert "wrote inception.paragraph" in out
    assert "fresh process (TVM's runtime alone): same outputs" in out


def test_tune_then_search(capsys, cache, monkeypatch):
    out = _run("tune_then_search", capsys, cache, monkeypatch, trials=1, max_tasks=1,
               budget=5.0)
    assert "tuned forms faster alone" in out and "model check" in out and "untuned" in out
    assert "autograph search with tuned kernels" in out
