"""The public-model corpus (`benchmarks/corpus_models.py`), the benchmark's pure parts
(`benchmarks/corpus.py`: rows, ratios, the output check) and the tables `benchmarks/report.py`
renders from its results file. No torchvision, TVM or timing: a few seconds."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
if str(BENCHMARKS) not in sys.path:  # the benchmarks import each other as scripts do
    sys.path.insert(0, str(BENCHMARKS))

import corpus  # noqa: E402
import corpus_models  # noqa: E402


def _report():
    spec = importlib.util.spec_from_file_location("report", BENCHMARKS / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = _report()


def test_the_spec_list_is_well_formed():
    specs = corpus_models.SPECS
    names = [s.name for s in specs]
    assert len(specs) >= 30
    assert len(set(names)) == len(names)
    assert {"mobile", "branchy", "modern", "transformer", "recurrent"} <= {s.kind for s in specs}
    assert {s.kind for s in specs} <= set(corpus.KINDS)
    assert {s.package for s in specs} <= {"torchvision", "timm", "transformers", "torch"}
    assert all(callable(s.make) for s in specs)
    assert corpus_models.BY_NAME == {s.name: s for s in specs}


def test_rows_are_the_corpus_then_the_zoo_and_select_filters_them():
    rows = corpus.all_models()
    assert len(set(rows)) == len(rows)
    assert rows[:len(corpus_models.SPECS)] == [s.name for s in corpus_models.SPECS]
    zoo = [r for r in rows if r.startswith(corpus.ZOO_PREFIX)]
    assert zoo and all(corpus.describe(r) == ("zoo", "paragraph") for r in zoo)
    assert corpus.describe("gpt2_6l") == ("transformer", "transformers")
    assert corpus.select("", "recurrent") == ["lstm_lm", "gru_classifier"]
    assert corpus.select("resnet18,zoo:resnet50", "zoo") == ["zoo:resnet50"]
    with pytest.raises(SystemExit, match="unknown model"):
        corpus.select("resnet19", "")
    with pytest.raises(SystemExit, match="unknown kinds"):
        corpus.select("", "cnn")


def test_the_output_check_is_relative_to_the_largest_reference_value():
    ref = [np.array([[10.0, -20.0]], np.float32)]
    assert corpus.relative_error(ref, [np.array([[10.0, -20.002]])]) == pytest.approx(1e-4)
    assert corpus.relative_error(ref, ref) == 0.0
    assert corpus.relative_error(ref, [np.zeros((2, 1))]) == math.inf  # another shape
    assert corpus.relative_error(ref, [np.array([[np.nan, 0.0]])]) == math.inf
    assert corpus.relative_error(ref, []) == math.inf


def test_ratios_are_speed_ratios_and_the_best_peer_is_the_fastest_f32_one():
    s = corpus.summary({"onnxruntime": 8.0, "onnxruntime:parallel": 6.0, "openvino": 5.0,
                        "pytorch": 2.0, "paragraph": 4.0})
    assert s["best_peer"] == "openvino" and s["best_peer_ms"] == 5.0  # PyTorch is no f32 peer
    assert s["paragraph_vs_onnxruntime"] == 2.0
    assert s["paragraph_vs_best_peer"] == 1.25
    assert s["paragraph_vs"] == {"onnxruntime": 2.0, "onnxruntime:parallel": 1.5,
                                 "openvino": 1.25, "pytorch": 0.5, "best_peer": 1.25}
    assert s["paragraph_search_ms"] is None and s["search_vs_onnxruntime"] is None
    failed = corpus.summary({"onnxruntime": 8.0, "openvino": 9.0})  # paragraph did not import
    assert failed["paragraph_ms"] is None and failed["paragraph_vs"] == {}
    assert failed["best_peer"] == "onnxruntime" and failed["paragraph_vs_best_peer"] is None


def _row(model: str, kind: str, ms: dict[str, float], **extra) -> dict:
    """A row as `corpus.bench_one` writes it, for the fields the report reads."""
    row = {"model": model, "kind": kind, "package": "torchvision", "import_ok": True,
           "build_ok": True, "equal": True, "error": None, "errors": {}, "build_s": 30.0,
           "kernels": {"vendor": 40, "tvm_tuned": 0, "tvm_untuned": 3, "tuning_db": None},
           "max_rel_error": {"onnxruntime": 0.0, "openvino": 1e-6, "paragraph": 2e-6},
           "search": None, "contended": False, **corpus.summary(ms)}
    row.update(extra)
    return row


def _results(tmp_path: Path) -> Path:
    models = [
        _row("mobilenet_v2", "mobile", {"onnxruntime": 2.0, "onnxruntime:parallel": 3.0,
                                        "openvino": 1.6, "pytorch": 5.0, "paragraph": 4.0}),
        _row("shufflenet_v2_x1_0", "mobile", {"onnxruntime": 3.0, "openvino": 2.5},
             import_ok=False, build_ok=False, equal=False, build_s=None, kernels=None,
             max_rel_error={"onnxruntime": 0.0, "openvino": 1e-6},
             error="import: AssertionError: emit_te now only supports Tensor that has "
                   "ShapeExpr shape"),
        _row("gpt2_6l", "transformer", {"onnxruntime": 12.5, "onnxruntime:parallel": 20.0,
                                        "openvino": 11.0, "paragraph": 10.0}, contended=True),
        {"model": "lstm_lm", "kind": "recurrent", "package": "torch", "import_ok": None,
         "build_ok": None, "equal": None, "crashed": True, "errors": {},
         "error": "timed out after 1800 s: lowering"},
    ]
    path = tmp_path / "corpus-cpu.json"
    path.write_text(json.dumps({
        "benchmark": "corpus", "blocks": 8, "block": 5, "tolerance": 1e-4, "search": None,
        "machine": {"cpu": "AMD EPYC", "cores": 2, "date": "2026-12-01T00:00:00+00:00"},
        "models": models, "failed": []}))
    return path


def test_the_readme_summary_counts_each_kind(tmp_path):
    _results(tmp_path)
    lines = report.render("corpus", tmp_path)
    table = "\n".join(lines)
    prose = " ".join(line for line in lines if not line.startswith("|"))
    assert "| mobile | 2 | 1 | 1 | 0 | 0.50x | 0.40x | 30 |" in table
    assert "| transformer | 1 | 1 | 1 | 1 | 1.25x | 1.10x | 30 |" in table
    assert "| recurrent | 1 | 0 | 0 | 0 | - | - | - |" in table
    assert f"| all | 4 | 2 | 2 | 1 | {math.sqrt(0.5 * 1.25):.2f}x |" in table
    assert "imported 2 of 4" in prose and "ahead of it on 1 of 2 timed" in prose
    assert "1 timed while other work held a core" in prose
    assert all(len(line) <= 100 for line in lines)  # the README's limit


def test_the_docs_table_has_every_model_by_kind_and_what_failed(tmp_path):
    _results(tmp_path)
    table = "\n".join(report.render("corpus-models", tmp_path))
    assert ("| mobilenet_v2 | yes | yes | 2.00 | 1.60 | 4.00 | 0.50x | 0.40x (openvino) | 30 "
            "| 40 / 3 |") in table
    assert "| shufflenet_v2_x1_0 | no | - | 3.00 | 2.50 | - | - | - | - | - |" in table
    assert ("| gpt2_6l (contended) | yes | yes | 12.5 | 11.0 | 10.0 | 1.25x | 1.10x (openvino) "
            "| 30 | 40 / 3 |") in table
    assert "| lstm_lm | failed | - | - | - | - | - | - | - | - |" in table
    assert table.index("**mobile** (2 models;") < table.index("**transformer** (1 model;")
    assert "- shufflenet_v2_x1_0: import: AssertionError: emit_te" in table
    assert "- lstm_lm: timed out after 1800 s" in table


def test_without_the_results_file_both_blocks_say_so(tmp_path):
    for block in ("corpus", "corpus-models"):
        text = "\n".join(report.render(block, tmp_path))
        assert "corpus-cpu.json" in text and "|" not in text


def test_the_plot_is_drawn_from_the_results_file(tmp_path):
    result = json.loads(_results(tmp_path).read_text())
    out = corpus.plot(result, tmp_path / "corpus-cpu.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result["models"] = [m for m in result["models"] if not m.get("paragraph_ms")]
    assert corpus.plot(result, tmp_path / "none.png").exists()  # nothing timed: no bars
