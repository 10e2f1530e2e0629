"""The README and docs/performance.md quote only what `benchmarks/report.py` renders from the
committed JSON, and the README stays a guide (short, readable lines). Reads JSON only: no TVM."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PERFORMANCE = ROOT / "docs" / "performance.md"


def _report():
    spec = importlib.util.spec_from_file_location("report", ROOT / "benchmarks" / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = _report()


@pytest.mark.parametrize("page", [README, PERFORMANCE], ids=lambda p: p.name)
def test_marked_blocks_equal_the_report(page):
    stale = report.stale(page)
    assert not stale, (f"{page.relative_to(ROOT)}: blocks {stale} differ from what "
                       "benchmarks/report.py renders; run `python benchmarks/report.py --write`")


def test_readme_holds_the_zoo_and_corpus_tables_and_performance_every_block():
    readme = report.blocks(README.read_text())
    assert {"zoo", "corpus"} <= set(readme)
    assert "| model | ONNX Runtime | PyTorch | TVM VM |" in readme["zoo"]
    performance = report.blocks(PERFORMANCE.read_text())
    missing = set(report.BLOCKS) - {"zoo"} - set(performance)
    assert not missing, f"docs/performance.md lacks the blocks {sorted(missing)}"


def test_readme_is_a_guide():
    lines = README.read_text().splitlines()
    assert len(lines) <= 260, f"README.md has {len(lines)} lines (at most 260)"
    long = [(n, len(line)) for n, line in enumerate(lines, 1) if len(line) > 100]
    assert not long, f"README.md lines over 100 characters (line, length): {long}"


def test_a_stale_block_is_found_and_rewritten(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- report:micro -->\nold figures\n<!-- /report:micro -->\nend\n")
    assert report.stale(page) == ["micro"]
    page.write_text(report.fill(page.read_text()))
    assert report.stale(page) == []
    assert page.read_text().startswith("intro\n") and page.read_text().endswith("end\n")


def test_the_corpus_table_appears_when_its_json_does(tmp_path):
    waiting = "\n".join(report.render("corpus", tmp_path))
    assert "corpus-cpu.json" in waiting and "|" not in waiting
    # the fields `benchmarks/corpus.py` writes (tests/test_corpus.py renders fuller rows)
    row = {"import_ok": True, "equal": True, "build_s": 20.0, "best_peer": "onnxruntime"}
    (tmp_path / "corpus-cpu.json").write_text(json.dumps({
        "blocks": 8, "block": 5, "tolerance": 1e-4,
        "machine": {"cpu": "AMD EPYC", "cores": 2, "date": "2026-12-01T00:00:00+00:00"},
        "models": [{**row, "model": "mobilenet_v2", "kind": "mobile", "paragraph_ms": 4.0,
                    "onnxruntime_ms": 2.0, "paragraph_vs_onnxruntime": 0.5,
                    "paragraph_vs_best_peer": 0.5},
                   {**row, "model": "gpt2", "kind": "transformer", "paragraph_ms": 10.0,
                    "onnxruntime_ms": 12.5, "paragraph_vs_onnxruntime": 1.25,
                    "paragraph_vs_best_peer": 1.25}]}))
    table = "\n".join(report.render("corpus", tmp_path))
    prose = " ".join(line for line in table.splitlines() if not line.startswith("|"))
    assert "| mobile | 1 | 1 | 1 | 0 | 0.50x | 0.50x | 20 |" in table
    assert "| transformer | 1 | 1 | 1 | 1 | 1.25x | 1.25x | 20 |" in table
    assert "ahead of it on 1 of 2 timed" in prose
