"""How benchmarks write their results (`paragraph.bench.bench_models`): after every model,
atomically, with the machine and load, earlier rows kept with ``merge``, failures recorded."""

from __future__ import annotations

import json

import pytest

from paragraph.bench import bench_models
from paragraph.errors import ParagraphError


def _bench(name: str) -> dict:
    if name == "broken":
        raise ParagraphError("no such kernel")
    return {"model": name, "ms": len(name)}


def test_rows_are_written_after_each_model_with_failures_and_merged_rows(tmp_path):
    out = str(tmp_path / "results.json")
    said: list[str] = []
    bench_models(["b", "c"], _bench, out, {"benchmark": "toy"}, merge=False, log=said.append)
    first = json.loads(open(out).read())
    assert first["benchmark"] == "toy" and "machine" in first and "load_average_before" in first
    assert [m["model"] for m in first["models"]] == ["b", "c"]
    assert all("date" in m and "load_average" in m for m in first["models"])
    with pytest.raises(SystemExit, match="broken"):
        bench_models(["a", "broken", "c"], _bench, out, {"benchmark": "toy"}, merge=True,
                     log=said.append, order=["a", "b", "c"])
    second = json.loads(open(out).read())
    # b kept from the first run, a and c timed again, in the order given
    assert [m["model"] for m in second["models"]] == ["a", "b", "c"]
    assert second["failed"] == [{"model": "broken", "error": "no such kernel"}]
    assert said.count(f"wrote {out}") == 5


def test_results_options_name_the_file_and_merge():
    import argparse

    from paragraph.bench import add_results_options, results_path

    parser = argparse.ArgumentParser()
    parser.add_argument("--reduced", action="store_true")
    add_results_options(parser)
    assert results_path(parser.parse_args([]), "peers-cpu") == "benchmarks/results/peers-cpu.json"
    reduced = parser.parse_args(["--reduced", "--merge"])
    assert reduced.merge
    assert results_path(reduced, "peers-cpu") == "benchmarks/results/peers-cpu-reduced.json"
    assert results_path(parser.parse_args(["--json", "r.json"]), "peers-cpu") == "r.json"
