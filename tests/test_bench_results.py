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


def test_rows_of_another_machine_are_not_merged(tmp_path):
    """A results file measured on another CPU (here: another id, and AVX-512 where this one
    may lack it) is not merged with this machine's rows: one table, one kind of machine (two
    VMs both called "AMD EPYC" were a Zen 4 and a Zen 3 without AVX-512)."""
    from paragraph.machine import describe_machine, same_machine

    out = tmp_path / "results.json"
    bench_models(["a"], _bench, str(out), {"benchmark": "toy"}, merge=False, log=print)
    recorded = json.loads(out.read_text())
    assert same_machine(recorded["machine"]) is None
    assert "avx512" in describe_machine()
    recorded["machine"]["cpu_id"] = "GenuineIntel family 6 model 143 stepping 8"
    out.write_text(json.dumps(recorded))
    with pytest.raises(ParagraphError, match="another machine.*cpu_id"):
        bench_models(["b"], _bench, str(out), {"benchmark": "toy"}, merge=True, log=print)
    # without merging, the file is simply replaced
    bench_models(["b"], _bench, str(out), {"benchmark": "toy"}, merge=False, log=print)
    assert [m["model"] for m in json.loads(out.read_text())["models"]] == ["b"]
