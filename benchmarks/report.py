"""Markdown tables of the committed benchmark results, for the README and `docs/performance.md`.

Every figure the README and the docs quote comes from a JSON file under `benchmarks/results/`
through this script; `tests/test_docs.py` fails when a marked block of either page differs
from what it renders.

Usage::

    python benchmarks/report.py [RESULTS]            # print every docs table (RESULTS: a folder)
    python benchmarks/report.py --write [RESULTS]    # regenerate the marked blocks in place
    python benchmarks/report.py --check [RESULTS]    # exit 1 naming each stale block
    python benchmarks/report.py --block NAME         # print one block

A marked block is the text between ``<!-- report:NAME -->`` and ``<!-- /report:NAME -->`` in
`README.md` or `docs/performance.md` (`PAGES`); NAME is a key of `BLOCKS`. The README holds
``zoo`` (paragraph against ONNX Runtime, PyTorch and the TVM VM on the zoo) and ``corpus``
(the public-model comparison). ``corpus`` renders `corpus_table` from
``corpus-cpu.json`` once the corpus benchmark commits it, and one line saying so until then.

The corpus file's shape is defined by the corpus benchmark; this renderer reads only::

    {"machine": {"cpu": str, "cores": int, "date": str, ...},
     "models": [{"model": str, "kind": str, "paragraph_ms": float, "onnxruntime_ms": float,
                 ...}, ...]}

Only the standard library: no TVM import, so the test that keeps the pages true is fast.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGES = (ROOT / "README.md", ROOT / "docs" / "performance.md")
WIDTH = 100  # prose lines are wrapped to this; a table row is one line, however long

def _load(folder: Path, name: str) -> dict | None:
    path = folder / name
    return json.loads(path.read_text()) if path.exists() else None


def _date(result: dict) -> str:
    return result["machine"]["date"][:10]


def _dates(result: dict) -> str:
    """The run's date, or the first and last of its models' where they were timed apart
    (``--merge``)."""
    days = sorted({m.get("date", result["machine"]["date"])[:10] for m in result["models"]})
    return days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"


def _paired(name: str, p: dict) -> str:
    streams = "" if p["streams"] == 2 else f", {p['streams']} stream"
    return f"{name} {p['speedup']:.2f}x ({p['median_block_speedup']:.2f}x{streams})"


def executor_table(r: dict) -> list[str]:
    d = r["dispatch"]
    c = r["two_chains"]
    runner = f", {r['stream_runner']} stream runner" if r.get("stream_runner") else ""
    lines = [f"Executor ({r['kernels']} kernels{runner}, median of {r['repeat']} round-robin "
             f"runs, {_date(r)}; `benchmarks/executor.py`):", "",
             "| model | TVM VM ms | sequential ms (vs VM) | best schedule ms | 1 stream x 1 thread "
             "ms | best 2 streams x 1 thread ms (speedup) | 2-stream bound |",
             "|---|---|---|---|---|---|---|"]
    for m in r["models"]:
        rows = {x["config"]: x["median_ms"] for x in m["configs"]}
        vm, seq = rows["tvm_vm"], rows["executor:sequential"]
        best = min((v, k) for k, v in rows.items() if k.startswith("executor:"))
        one = rows["executor:sequential-1thread"]
        two = one / m["two_streams_1thread_speedup"]
        which = m.get("two_streams_best", "").split(":")[-1]
        bound = m.get("two_streams_bound")
        lines.append(f"| {m['model']} | {vm:.1f} | {seq:.1f} ({seq / vm:.2f}x) | {best[0]:.1f} "
                     f"({best[1].split(':')[1]}) | {one:.1f} | {two:.1f} "
                     f"({m['two_streams_1thread_speedup']:.2f}x{', ' + which if which else ''})"
                     f" | {'-' if bound is None else f'{bound:.2f}x'} |")
    lines += ["", f"Dispatch: {d['executor_overhead_us_per_kernel']:.2f} us per kernel over the "
              f"bare call (target < 30 us). Two independent chains of six 3x3 convolutions: "
              f"{c['one_stream_ms']:.1f} ms on one stream, {c['two_streams_ms']:.1f} ms on two "
              f"({c['speedup']:.2f}x)."]
    paired = [(m["model"], m["two_streams_paired"]) for m in r["models"]
              if m.get("two_streams_paired")]
    if paired:
        p = paired[0][1]
        lines += ["", "One 1-thread stream against critical-path on two 1-thread streams, "
                  f"{p['runs']} runs each in alternating blocks of {p['block']} (speedup of the "
                  "medians; median of the per-block speedups): "
                  + ", ".join(_paired(name, p) for name, p in paired) + "."]
    split = [m for m in r["models"] if m.get("split")]
    if split:
        lines += ["", "critical-path split lone convolutions across the two streams (output "
                  "channels; `paragraph.passes.split`) in "
                  + ", ".join(f"{m['model']} ({len(m['split'])})" for m in split)
                  + ". The same planner on the model's own kernels: "
                  + ", ".join(f"{m['model']} {_paired('', m['two_streams_paired_unsplit'])[1:]}"
                              f", bound {m['two_streams_bound_unsplit']:.2f}x"
                              for m in split if m.get("two_streams_paired_unsplit")) + "."]
    return lines


def gpu_executor_table(r: dict) -> list[str]:
    d = r["dispatch"]
    c = r["two_chains"]
    lines = [f"Executor on the GPU ({r['kernels']} kernels, median of {r['repeat']} round-robin "
             f"runs, {_date(r)}; `benchmarks/executor.py --target cuda`), ms:", "",
             "| model | TVM VM | tvm.compile default | sequential CUDA Graph | best multi-stream "
             "CUDA Graph (vs sequential) | best without CUDA Graph |", "|---|---|---|---|---|---|"]
    for m in r["models"]:
        rows = {x["config"]: x["median_ms"] for x in m["configs"]}
        seq = rows["executor:sequential"]
        graphs = [(v, k) for k, v in rows.items()
                  if k.startswith("executor:") and not k.endswith("nograph")
                  and k != "executor:sequential"]
        best = min(graphs)
        nograph = min((v, k) for k, v in rows.items() if k.endswith("+nograph"))
        lines.append(f"| {m['model']} | {rows['tvm_vm']:.2f} | {rows['tvm_compile_default']:.2f}"
                     f" | {seq:.2f} | {best[0]:.2f} ({best[1].split(':')[1]}, "
                     f"{seq / best[0]:.2f}x) | {nograph[0]:.2f} |")
    for f in r.get("failed", []):
        lines.append(f"| {f['model']} | failed: {f['error'][:80]} | | | | |")
    lines += ["", f"Dispatch: a CUDA Graph replays a trivial kernel in "
              f"{d['executor_us_per_kernel']:.1f} us (a bare launch {d['bare_kernel_us']:.1f} "
              f"us). Two independent chains of six 3x3 convolutions: {c['one_stream_ms']:.2f} ms "
              f"on one stream, {c['two_streams_ms']:.2f} ms on two ({c['speedup']:.2f}x)."]
    return lines


def schedules_table(r: dict) -> list[str]:
    names = ["sequential", "wavefront", "opara", "nimble", "critical-path", "ios-parallel",
             "ios-merge", "ios-both"]
    lines = [f"Schedules ({r['kernels']} kernels, IOS protocol {r['ios_protocol']}, median of "
             f"{r['repeat']} runs, {_date(r)}; `benchmarks/schedules.py`), ms:", "",
             "| model | " + " | ".join(names) + " | IOS-both search s |",
             "|---" * (len(names) + 2) + "|"]
    for m in r["models"]:
        rows = {x["config"]: x["median_ms"] for x in m["configs"]}
        cells = [f"{rows.get('executor:' + n, float('nan')):.1f}" for n in names]
        search = next(x["search_s"] for x in m["configs"] if x["config"] == "executor:ios-both")
        lines.append(f"| {m['model']} | " + " | ".join(cells) + f" | {search:.0f} |")
    return lines


def kernels_table(r: dict) -> list[str]:
    # its ONNX Runtime column was timed under load: the peers table replaces it
    lines = [f"Kernel sources (TVM VM / best executor schedule, ms; {_date(r)}; "
             "`benchmarks/kernels.py`; against ONNX Runtime see the peers table):", "",
             "| model | vendor | tuned TVM | untuned TVM |",
             "|---|---|---|---|"]
    def cell(m: dict, label: str) -> str:
        s = m.get(label)
        return "-" if s is None else f"{s['tvm_vm_ms']:.1f} / {s['best_executor_ms']:.1f}"

    for m in r["models"]:
        lines.append(f"| {m['model']} | {cell(m, 'vendor')} | {cell(m, 'tuned')} | "
                     f"{cell(m, 'tvm')} |")
    return lines


def peers_table(r: dict) -> list[str]:
    names = ["onnxruntime", "onnxruntime:parallel", "pytorch", "tvm_vm"]
    lines = [f"Peers, side by side in one process ({r['models'][0]['kernels']} kernels for the "
             f"TVM VM and paragraph; {r['blocks']} alternating blocks of {r['block']} runs, "
             f"median ms with p10-p90; {_dates(r)}; `benchmarks/peers.py`). paragraph's best is "
             "the fastest of its schedules; the bound, for schedules of 1-thread streams, is "
             "the larger of the 1-thread kernel time over the cores and its critical path (one "
             "stream of multi-thread kernels can beat it):", "",
             "| model | ONNX Runtime | ORT parallel | PyTorch | TVM VM | paragraph best "
             "(schedule) | vs ORT (target) | bound |", "|---|---|---|---|---|---|---|---|"]
    for m in r["models"]:
        rows = {x["config"]: x for x in m["configs"]}
        cells = [f"{rows[n]['median_ms']:.1f} ({rows[n]['p10_ms']:.1f}-{rows[n]['p90_ms']:.1f})"
                 for n in names]
        best = rows[m["paragraph_best"]]
        flag = " (contended)" if m.get("contended") else ""
        met = "met" if m["target_met"] else "not met"
        lines.append(f"| {m['model']}{flag} | " + " | ".join(cells) + f" | "
                     f"{best['median_ms']:.1f} ({best['p10_ms']:.1f}-{best['p90_ms']:.1f}, "
                     f"{m['paragraph_best'].split(':', 1)[1]}) | "
                     f"{m['paragraph_vs_onnxruntime']:.2f}x ({m['target_vs_onnxruntime']:.2f}x, "
                     f"{met}) | {m['bound_ms']:.1f} |")
    return lines


def serving_table(r: dict) -> list[str]:
    lines = [f"Serving, each run after {r['pause_ms']:g} ms idle against back to back, side by "
             f"side in one process ({r['kernels']} kernels, critical-path; {r['blocks']} "
             f"alternating blocks of {r['block']} runs, median ms with p10-p90; {_dates(r)}; "
             "`benchmarks/serving.py`):", "",
             "| model | ONNX Runtime back to back | paragraph back to back | vs ORT | "
             "ONNX Runtime after a pause | paragraph after a pause | vs ORT |",
             "|---|---|---|---|---|---|---|"]
    for m in r["models"]:
        cells = []
        for kind in ("back_to_back", "after_pause"):
            rows = {x["config"]: x for x in m[kind]}
            cells += [f"{rows[n]['median_ms']:.1f} ({rows[n]['p10_ms']:.1f}-"
                      f"{rows[n]['p90_ms']:.1f})" for n in ("onnxruntime", "paragraph")]
            cells.append(f"{rows['paragraph']['speed_vs_onnxruntime']:.2f}x")
        flag = " (contended)" if m.get("contended") else ""
        lines.append(f"| {m['model']}{flag} | " + " | ".join(cells) + " |")
    return lines


def search_table(r: dict) -> list[str]:
    names = ["tvm_vm", "none+sequential", "none+best", "greedy+best", "taso+sequential",
             "taso+best", "taso+loop+best", "autograph+best", "simulated+best"]
    timing = (f"median of {r['blocks']} alternating blocks of {r['block']} runs"
              if r.get("timing") == "blocks" else f"median of {r['repeat']} round-robin runs")
    lines = [f"Substitution search, AutoGraph's table 2 ({r['kernels']} kernels, budget "
             f"{r['budget_s']:.0f} s and top-k {r['top_k']} per search, {timing}, "
             f"{_dates(r)}; `benchmarks/search.py`), ms "
             "(search s / candidates built; \"= row\": the same program as that row, timed "
             "once). taso: TASO as published, its cheapest graph by the sum cost kept "
             "unconfirmed (one search for both schedules); taso+loop: TASO's cost in "
             "AutoGraph's on-board loop; \"-\": a model timed before the taso columns "
             "existed; fastest: with the parallel searches that ran its very program:", "",
             "| model | " + " | ".join(names) + " | fastest |", "|---" * (len(names) + 2) + "|"]
    for m in r["models"]:
        rows = {x["config"]: x for x in m["configs"]}
        cells = []
        for n in names:
            x = rows.get(n)
            if x is None:
                skipped = n in m.get("skipped_for_time", []) or (
                    n == "taso+sequential" and "taso+best" in m.get("skipped_for_time", []))
                cells.append("skipped (time limit)" if skipped else "-")
                continue
            same = f"= {x['same_as']}; " if "same_as" in x else ""
            extra = (f" ({same}{x['search_s']:.0f} s / {x['candidates_built']})"
                     if "search_s" in x else f" ({same[:-2]})" if same else "")
            shared = x.get("search_shared_with")
            if shared:
                extra = (f" (= {shared})" if x.get("same_as") == shared
                         else f" ({same}the graph of {shared})")
            cells.append(f"{x['median_ms']:.2f}{extra}")
        flag = " (contended)" if m.get("contended") else ""
        if "kernel_cost_protocol" in m:  # a file merged from runs with their own settings
            flag += (f" ({m['date'][:10]}, {m['budget_s']:.0f} s / top-k {m['top_k']}, "
                     f"{'host-timed' if m['kernel_cost_protocol'] == 'host-sync' else 'GPU-time'}"
                     " kernel costs)")
        # the parallel searches that ran the fastest row's very program (kept their input)
        fastest = " = ".join([m["fastest"], *(c for c in m.get("tied_with_fastest", [])
                                                 if c in ("autograph+best", "simulated+best"))])
        lines.append(f"| {m['model']}{flag} | " + " | ".join(cells) + f" | {fastest} |")
    for f in r.get("failed", []):
        lines.append(f"| {f['model']} | failed: {f['error'][:100]} |" + " |" * len(names))
    if any("kernel_cost_protocol" in m for m in r["models"]):
        lines += ["", "Settings differ by row (the model cell says each row's date, budget, "
                  "top-k and kernel costs); the header's are the first row's."]
    return lines


def regroup_table(r: dict) -> list[str]:
    """ResNeXt-50's grouped convolutions regrouped or split (`benchmarks/regroup.py`)."""
    rows: dict[str, dict[str, float]] = {}
    for c in r["configs"]:
        if " / " in c["config"]:
            variant, schedule = c["config"].split(" / ")
            rows.setdefault(variant, {})[schedule] = c["median_ms"]
    base = rows["32 groups (input)"]["sequential"]
    lines = [f"ResNeXt-50's 32-group convolutions rewritten as TASO and AutoGraph did on a GPU "
             f"({r['kernels']} kernels, median of {r['blocks']} alternating blocks of "
             f"{r['block']} runs, {_date(r)}; `benchmarks/regroup.py`), ms:", "",
             "| variant | 2 threads (vs input) | 1 thread | critical-path |", "|---|---|---|---|"]
    for variant, t in rows.items():
        cp = f"{t['critical-path']:.2f}" if "critical-path" in t else "-"
        lines.append(f"| {variant} | {t['sequential']:.2f} ({base / t['sequential']:.2f}x) | "
                     f"{t['sequential, 1 thread']:.2f} | {cp} |")
    return lines


def _ms(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def zoo_table(r: dict, xeon: dict | None = None) -> list[str]:
    """The README's table: the zoo against the runtimes a user already has, narrow enough for
    100-character lines (the full table with p10-p90 and the bound is `peers_table`)."""
    m0 = r["machine"]
    xeon_note = ""
    if xeon is not None:
        searched = any("search" in c for m in xeon["models"] for c in m["configs"])
        xeon_note = (f" The last column is the same benchmark on a {xeon['machine']['cores']}-core "
                     f"{xeon['machine']['cpu']} VM ({_dates(xeon)}, `peers-cpu-xeon.json`"
                     f"{'' if searched else ', no search rows'}).")
    worst = max(c.get("max_diff_vs_onnxruntime", 0.0) for m in r["models"] for c in m["configs"])
    lines = [f"Median ms, batch 1, float32, on a {m0['cores']}-core {m0['cpu']} VM, every runtime "
             f"side by side in one process ({r['blocks']} alternating blocks of {r['block']} "
             f"runs, {_dates(r)}; `benchmarks/results/peers-cpu.json`). paragraph's column is "
             "the fastest of its schedules (vendor kernels, as for the TVM VM); its outputs "
             f"differ from ONNX Runtime's by at most {worst:.1e}." + xeon_note, "",
             "| model | ONNX Runtime | PyTorch | TVM VM | paragraph (schedule) | vs ORT"
             + (" | vs ORT, Xeon |" if xeon else " |"),
             "|---|---|---|---|---|---" + ("|---|" if xeon else "|")]
    other = {m["model"]: m for m in (xeon or {}).get("models", [])}
    for m in r["models"]:
        rows = {x["config"]: x["median_ms"] for x in m["configs"]}
        flag = " (contended)" if m.get("contended") else ""
        cells = [_ms(rows[n]) for n in ("onnxruntime", "pytorch", "tvm_vm")]
        best = f"{_ms(rows[m['paragraph_best']])} ({m['paragraph_best'].split(':', 1)[1]})"
        line = (f"| {m['model']}{flag} | " + " | ".join(cells) + f" | {best} | "
                f"{m['paragraph_vs_onnxruntime']:.2f}x |")
        if xeon is not None:
            x = other.get(m["model"])
            line += f" {x['paragraph_vs_onnxruntime']:.2f}x |" if x else " - |"
        lines.append(line)
    return lines


def _geo(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _cell(v: float | None) -> str:
    return "-" if v is None else _ms(v)


def _timed(rows: list[dict], key: str) -> list[float]:
    return [m[key] for m in rows if m.get(key) is not None]


def _corpus_head(r: dict) -> str:
    m0 = r["machine"]
    # the search's rows, not the file's last run: a merged run with search may cover a few
    searched_rows = [m["search"] for m in r["models"] if m.get("search")]
    searched = ""
    if searched_rows:
        s0 = searched_rows[0]
        kept = sum(1 for s in searched_rows if s.get("same_as") == "paragraph")
        searched = (f"; on {len(searched_rows)} of them paragraph also with the {s0['method']} "
                    f"search, {s0['budget_s']:.0f} s a model, beside its default build: it "
                    f"kept its input on {kept}")
    return (f"{len(r['models'])} models, batch 1, float32, each in a process of its own, every "
            f"runtime side by side ({r['blocks']} alternating blocks of {r['block']} runs or "
            "more: a block lasts 20 ms or more, "
            f"median ms) on a {m0['cores']}-core {m0['cpu']} ({_dates(r)}; "
            f"`benchmarks/corpus.py`{searched}). Ratios are speed ratios (peer ms / paragraph "
            "ms, above 1: paragraph faster); the best peer is the fastest of ONNX Runtime's two "
            "executors and OpenVINO (f32); equal: paragraph's outputs within "
            f"{r['tolerance']:.0e} of ONNX Runtime's, relative to their largest"
            f"{_rounding_note(r)}.")


def _rounding_note(r: dict) -> str:
    """Where a row's tolerance was widened to the model's float32 rounding, which rows."""
    wide = [m["model"] for m in r["models"] if m.get("reference_rounding") is not None]
    if not wide:
        return ""
    return (f", or within 4x ONNX Runtime's own distance from the model in float64 where "
            f"that is more ({', '.join(wide)})")


def corpus_table(r: dict) -> list[str]:
    """The README's summary of the public corpus (``corpus-cpu.json``, written by
    `benchmarks/corpus.py`; its docstring defines the fields): per kind, how many models
    paragraph imported, matched and beat, and the geometric means of its speed ratios."""
    rows = r["models"]
    kinds = list(dict.fromkeys(m["kind"] for m in rows))
    vs_ort = _timed(rows, "paragraph_vs_onnxruntime")
    vs_best = _timed(rows, "paragraph_vs_best_peer")
    contended = sum(bool(m.get("contended")) for m in rows)
    lines = [f"Public architectures (torchvision, timm, Hugging Face transformers, torch.nn) and "
             f"the zoo's exports against the CPU runtimes: {_corpus_head(r)} paragraph imported "
             f"{sum(bool(m.get('import_ok')) for m in rows)} of {len(rows)}, matched ONNX "
             f"Runtime on {sum(bool(m.get('equal')) for m in rows)} and was ahead of it on "
             f"{sum(x > 1 for x in vs_ort)} of {len(vs_ort)} timed (geometric mean "
             f"{_geo(vs_ort):.2f}x; against the best peer {_geo(vs_best):.2f}x)"
             + (f"; {contended} timed while other work held a core" if contended else "")
             + ". Every model's row is in docs/performance.md, the plot in "
             "`benchmarks/results/corpus-cpu.png`.", "",
             "| kind | models | imported | equal | ahead of ORT | vs ORT | vs best peer | "
             "build s, median |", "|---|---|---|---|---|---|---|---|"]
    for kind in [*kinds, "all"]:
        of = [m for m in rows if kind in ("all", m["kind"])]
        ort, best = _timed(of, "paragraph_vs_onnxruntime"), _timed(of, "paragraph_vs_best_peer")
        build = _timed(of, "build_s")
        lines.append(f"| {kind} | {len(of)} | {sum(bool(m.get('import_ok')) for m in of)} | "
                     f"{sum(bool(m.get('equal')) for m in of)} | {sum(x > 1 for x in ort)} | "
                     f"{_x(_geo(ort) if ort else None)} | {_x(_geo(best) if best else None)} | "
                     f"{f'{statistics.median(build):.0f}' if build else '-'} |")
    return lines


def corpus_models_table(r: dict) -> list[str]:
    """Every model of the public corpus (``corpus-cpu.json``), a table per kind: imported,
    equal, ONNX Runtime, OpenVINO and paragraph medians, the speed ratios, build seconds,
    kernels by source; then what failed, and why."""
    rows = r["models"]
    search = r.get("search") is not None
    lines = [f"Public architectures and the zoo's exports: {_corpus_head(r)} Kernels: vendor / "
             "TVM (untuned: paragraph's defaults use no tuning database). The PyTorch eager "
             "and ONNX Runtime parallel columns, p10-p90 and peak memory are in the JSON."]
    failures: list[str] = []
    for kind in dict.fromkeys(m["kind"] for m in rows):
        of = [m for m in rows if m["kind"] == kind]
        ort, best = _timed(of, "paragraph_vs_onnxruntime"), _timed(of, "paragraph_vs_best_peer")
        means = (f"; geometric mean {_geo(ort):.2f}x against ONNX Runtime, {_geo(best):.2f}x "
                 "against the best peer" if ort and best else "")
        lines += ["", f"**{kind}** ({len(of)} model{'s' * (len(of) > 1)}{means}):", "",
                  "| model | import | equal | ONNX Runtime | OpenVINO | paragraph | vs ORT | "
                  "vs best peer | build s | kernels |" + (" with search (vs ORT) |" if search
                                                          else ""),
                  "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if search else "")]
        for m in of:
            flag = " (contended)" if m.get("contended") else ""
            imported = ("failed" if m.get("crashed") else "yes" if m.get("import_ok")
                        else "no")
            err = m.get("max_rel_error", {})
            ours = [v for k, v in err.items() if k.startswith("paragraph")]
            equal = ("-" if not ours else "yes" if m.get("equal")
                     else f"no ({max(ours):.1e})")
            k = m.get("kernels")
            kernels = "-" if k is None else f"{k['vendor']} / {k['tvm_tuned'] + k['tvm_untuned']}"
            best_peer = (f"{_x(m.get('paragraph_vs_best_peer'))} ({m['best_peer']})"
                         if m.get("paragraph_vs_best_peer") is not None else "-")
            build = "-" if m.get("build_s") is None else f"{m['build_s']:.0f}"
            line = (f"| {m['model']}{flag} | {imported} | {equal} | "
                    f"{_cell(m.get('onnxruntime_ms'))} | {_cell(m.get('openvino_ms'))} | "
                    f"{_cell(m.get('paragraph_ms'))} | {_x(m.get('paragraph_vs_onnxruntime'))} | "
                    f"{best_peer} | {build} | {kernels} |")
            if search:
                s = m.get("search")
                line += (" - |" if m.get("paragraph_search_ms") is None else
                         f" {_ms(m['paragraph_search_ms'])} "
                         f"({_x(m.get('search_vs_onnxruntime'))}, "
                         f"{len(s['rules']) if s else 0} rewrites) |")
            lines.append(line)
            if m.get("error"):
                failures.append(f"- {m['model']}: {' '.join(m['error'].split())[:160]}")
    if failures:
        lines += ["", "What failed (the first error of each model; the peers were still timed "
                  "where they ran):", "", *failures]
    return lines


def corpus_avx2_table(avx2: dict, native: dict | None) -> list[str]:
    """The corpus with ``PARAGRAPH_CPU_ISA=avx2`` (``corpus-cpu-avx2.json``): paragraph as on
    an AVX2-only CPU against the peers held to AVX2 where their libraries read the limit
    (PyTorch's oneDNN and MKL; OpenVINO given the same variable) and ONNX Runtime, whose MLAS
    has no limit and runs with AVX-512; beside it, paragraph's native time from
    ``corpus-cpu.json`` (what AVX-512 is worth to it). Per kind, geometric means."""
    by_name = {m["model"]: m for m in (native or {}).get("models", [])}
    rows = avx2["models"]
    lines = [f"With `PARAGRAPH_CPU_ISA=avx2` ({len(rows)} models, {_dates(avx2)}; "
             f"{avx2['blocks']} alternating blocks, medians, "
             f"{avx2['machine']['cores']}-core {avx2['machine']['cpu']}): paragraph's own "
             "kernels are AVX-512 only, so every vendor kernel is oneDNN's or MKL's through "
             "PyTorch, held to AVX2, and TVM compiles for a Haswell. OpenVINO and PyTorch run "
             "in the same process under `ONEDNN_MAX_CPU_ISA=AVX2` and "
             "`MKL_ENABLE_INSTRUCTIONS=AVX2` (whether OpenVINO's own oneDNN honours it is not "
             "checked); ONNX Runtime cannot be held to AVX2 and used AVX-512 (an unfair peer). "
             "Ratios are speed ratios (peer ms / paragraph ms); native: paragraph's AVX-512 "
             "time in `corpus-cpu.json` over its AVX2 time.", "",
             "| kind | models | equal | vs ORT (AVX-512) | vs OpenVINO | vs PyTorch | "
             "AVX2 / native |", "|---|---|---|---|---|---|---|"]

    def ratio(m: dict, peer: str) -> float | None:
        ours, theirs = m.get("paragraph_ms"), m.get(peer)
        return theirs / ours if ours and theirs else None

    def native_ratio(m: dict) -> float | None:
        n = by_name.get(m["model"], {}).get("paragraph_ms")
        return n / m["paragraph_ms"] if n and m.get("paragraph_ms") else None

    kinds = list(dict.fromkeys(m["kind"] for m in rows))
    for kind in [*kinds, "all"]:
        of = [m for m in rows if kind in ("all", m["kind"])]
        cells = []
        for get in (lambda m: ratio(m, "onnxruntime_ms"), lambda m: ratio(m, "openvino_ms"),
                    lambda m: ratio(m, "pytorch_ms"), native_ratio):
            xs = [x for x in map(get, of) if x is not None]
            cells.append(_x(_geo(xs)) if xs else "-")
        lines.append(f"| {kind} | {len(of)} | {sum(bool(m.get('equal')) for m in of)} | "
                     + " | ".join(cells) + " |")
    lines += ["", "| model | paragraph AVX2 | native | ONNX Runtime | OpenVINO | PyTorch |",
              "|---|---|---|---|---|---|"]
    for m in rows:
        n = by_name.get(m["model"], {}).get("paragraph_ms")
        flag = " (contended)" if m.get("contended") else ""
        lines.append(f"| {m['model']}{flag} | {_cell(m.get('paragraph_ms'))} | {_cell(n)} | "
                     f"{_cell(m.get('onnxruntime_ms'))} | {_cell(m.get('openvino_ms'))} | "
                     f"{_cell(m.get('pytorch_ms'))} |")
    return lines


def corpus_plain_avx2_table(r: dict) -> list[str]:
    """The corpus on a CPU without AVX-512 (``corpus-cpu-zen3.json``): every runtime, ONNX
    Runtime's MLAS included, runs its own AVX2 code, as paragraph does there (its AVX2 forms,
    oneDNN's and MKL's, TVM for the CPU): the fair comparison for such machines. The per-kind
    summary as `corpus_table`'s, then every model's row as `corpus_models_table`'s."""
    m0 = r["machine"]
    return ([f"On a CPU without AVX-512 ({m0['cpu']}, {m0['cpu_id']}; `corpus-cpu-zen3.json`), "
             "where every peer's own AVX2 code runs too:", ""]
            + corpus_table(r)[2:] + [""] + corpus_models_table(r))


def costmodel_table(r: dict) -> list[str]:
    """The search's cost against whole runs (``costmodel-cpu.json``, `benchmarks/costmodel.py`):
    per model and cost, the median absolute error read as seconds, the same anchored on the
    input's measured time, and Kendall tau over pairs measured 3% apart or more."""
    m0 = r["machine"]
    costs = ("simulated", "mixed", "sum", "critical-path")
    lines = [f"{r['candidates']} random verified rewrites of each model (1 to {r['steps']} "
             f"rewrites each, seed {r['seed']}), priced by the search's cost model and timed "
             f"end to end beside the input ({r['repeat']} alternating blocks of {r['block']}, "
             f"medians; {m0['cores']}-core {m0['cpu']}, {_dates(r)}). Per cost: median "
             "absolute error read as seconds / anchored on the input's measured time / Kendall "
             f"tau over pairs measured {r['pair_gap']:.0%} apart or more (pairs), or as far "
             "apart as a second build of the input (its twin, timed in every batch since "
             "2026-11-30) landed from it where that is more (gap). Targets (issue 54): error "
             "at most 10%, tau at least 0.8.", "",
             "| model | candidates | measured / input's | gap | " + " | ".join(costs) + " |",
             "|---|---|---|---|" + "---|" * len(costs)]
    for m in r["models"]:
        base = m["input"]["measured_ms"]
        spread = [c["measured_ms"] / base for c in m["candidates"]]
        cells = []
        for cost in costs:
            a = m["accuracy"][cost]
            tau = "-" if a["kendall_tau"] is None else f"{a['kendall_tau']:.2f}"
            cells.append(f"{a['median_abs_error']:.0%} / {a['median_abs_error_anchored']:.0%}"
                         f" / {tau} ({a['pairs']})")
        flag = " (contended)" if m.get("contended") else ""
        gap = m.get("pair_gap_used")
        lines.append(f"| {m['model']}{flag} | {len(m['candidates'])} | "
                     f"{min(spread):.2f}-{max(spread):.2f} | "
                     f"{'no twin' if gap is None else f'{gap:.1%}'} | "
                     + " | ".join(cells) + " |")
    return lines


def _corpus_avx2(folder: Path) -> list[str] | None:
    avx2 = _load(folder, "corpus-cpu-avx2.json")
    return None if avx2 is None else corpus_avx2_table(avx2, _load(folder, "corpus-cpu.json"))


def kernel_classes_table(r: dict) -> list[str]:
    """paragraph's kernel time by class against ONNX Runtime's profiler
    (`benchmarks/kernel_classes.py`)."""
    graph = ("" if "as_imported" not in r else ", the model's own graph" if r["as_imported"]
             else ", the program its default plan runs")
    rewritten = "".join(
        f" {m['model']}'s program has {len(m['rewrites'])} rewrites ("
        + ", ".join(sorted({x.split(':')[0] for x in m["rewrites"]})) + ")."
        for m in r["models"] if m.get("rewrites"))
    lines = [f"Kernel time by class ({r['kernels']} kernels, {r['schedule']}, paragraph's "
             f"per-kernel timeline against ONNX Runtime's profiler{graph}; {_dates(r)}; "
             "`benchmarks/kernel_classes.py`), ms; \"behind\" lists the classes where "
             f"paragraph took longer.{rewritten}", "",
             "| model | threads | paragraph | ONNX Runtime | ratio | behind (paragraph / ORT ms) |",
             "|---|---|---|---|---|---|"]
    for m in r["models"]:
        for threads, t in sorted(m["threads"].items()):
            ours, theirs = t["paragraph_ms"], t["onnxruntime_ms"]
            behind = [f"{k} {ours[k]:.3f} / {theirs.get(k, 0.0):.3f}" for k in ours
                      if ours[k] > theirs.get(k, 0.0)]
            flag = " (contended)" if m.get("contended") else ""
            lines.append(f"| {m['model']}{flag} | {threads} | {t['paragraph_total_ms']:.1f} | "
                         f"{t['onnxruntime_total_ms']:.1f} | "
                         f"{t['onnxruntime_total_ms'] / t['paragraph_total_ms']:.2f}x | "
                         f"{', '.join(behind) or '-'} |")
    return lines


def tuning_table(r: dict) -> list[str]:
    """What a tuning database applies, checked on the model (`benchmarks/tuning.py`)."""
    check = r["model_check"]
    lines = [f"Tuning ({r['model']}, {r['trials']} MetaSchedule trials a kernel, {r['kernels']} "
             f"kernels, {r['schedule']}, blocks {r['blocks']}, side by side in one process; "
             f"{_date(r)}; `benchmarks/tuning.py`): of {r['tuned_forms']} tuned forms "
             f"{r['tuned_forms_faster_alone']} ran faster alone and {r['tuned_forms_applied']} "
             "were applied by the model check (nested sets of "
             + ", ".join(str(s) for s in check["sizes"]) + " kernels timed end to end), ms:", "",
             "| configuration | median ms | schedule |", "|---|---|---|"]
    for name, x in r["results"].items():
        lines.append(f"| {name} | {x['median_ms']:.3f} | {x['schedule']} |")
    return lines


def team_binding_table(r: dict) -> list[str]:
    """A run after a pause with the OpenMP team bound one thread per core and unbound
    (`benchmarks/team_binding.py`)."""
    lines = [f"Binding the OpenMP team one thread per core, after {r['pause_ms']:g} ms idle and "
             f"back to back ({r['timing']}, {r['rounds']} rounds of alternating processes; "
             f"{_date(r)}; `benchmarks/team_binding.py`), ms:", "",
             "| model | bound | back to back | after a pause | after a pause, p90 |",
             "|---|---|---|---|---|"]
    for x in r["rows"]:
        flag = " (contended)" if x.get("contended") else ""
        lines.append(f"| {x['model']}{flag} | {'yes' if x['bound'] else 'no'} | "
                     f"{x['back_to_back_ms']:.1f} | {x['after_pause_ms']:.1f} | "
                     f"{x['after_pause_p90_ms']:.1f} |")
    return lines


def refactor_table(r: dict) -> list[str]:
    """The 2026-11-23 restructuring against the code before it (``refactor-ab-cpu.json``)."""
    names = ["tvm_vm", "executor:sequential", "executor:nimble", "executor:critical-path"]
    lines = [f"Restructuring check ({_date(r)}, {r['machine']['cores']}-core "
             f"{r['machine']['cpu']}): {r['what']} Medians, ms:", "",
             "| model | code | round | " + " | ".join(n.split(":")[-1] for n in names) + " |",
             "|---" * (len(names) + 3) + "|"]
    for x in r["bench_runs"]:
        lines.append(f"| {x['model']} | {x['code']} | {x['round']} | "
                     + " | ".join(f"{x['medians_ms'][n]:.1f}" for n in names) + " |")
    return lines


def house_ab_table(r: dict) -> list[str]:
    """The 2026-11-28 restructuring against the code before it (``refactor-house-ab-cpu.json``):
    each run's ONNX Runtime and paragraph medians, side by side in one process."""
    lines = [f"Restructuring check ({_date(r)}, {r['machine']['cores']}-core "
             f"{r['machine']['cpu']}): {r['what']} Medians, ms:", "",
             "| model | code | run | ONNX Runtime | paragraph (best) | vs ORT |",
             "|---|---|---|---|---|---|"]
    for x in r["runs"]:
        lines.append(f"| {x['model']} | {x['code']} | {x['run']} | {x['onnxruntime_ms']:.2f} | "
                     f"{x['best_ms']:.2f} ({x['best'].split(':', 1)[1]}) | "
                     f"{x['speedup_vs_onnxruntime']:.2f}x |")
    return lines


def noise_table(r: dict) -> list[str]:
    """Two builds of one program timed side by side (``noise-cpu.json``): the measurement
    behind `paragraph.timing.MARGIN`."""
    s = r["summary"]
    lines = [f"Two builds of one program timed side by side, as the planner times its choices "
             f"({_date(r)}, {r['machine']['cores']}-core {r['machine']['cpu']}, "
             f"`benchmarks/noise.py`): {s['comparisons']} comparisons, differences "
             f"{s['median']:.1%} in the median, {s['p90']:.1%} at the 90th percentile, "
             f"{s['max']:.1%} at most. `paragraph.timing.MARGIN`, the one margin for faster "
             "beyond noise, is set above the 90th percentile.", "",
             "| model | plan | differences, % |", "|---|---|---|"]
    for m in r["models"]:
        lines.append(f"| {m['model']} | {m['schedule']} | "
                     + ", ".join(f"{100 * d:.2f}" for d in m["differences"]) + " |")
    return lines


def spin_table(r: dict) -> list[str]:
    """How long libgomp's idle workers spin (``spin-cpu.json``, `benchmarks/spin.py`):
    paragraph's time over ONNX Runtime's beside it, one process per setting, idle and with a
    busy loop on a core."""
    spins = [s or "default" for s in r["spins"]]
    keys = [f"{c}:{s}" for c in ("idle", "busy") for s in spins]
    out = [f"paragraph's default build over ONNX Runtime's default session at each "
           f"`GOMP_SPINCOUNT` ({_dates(r)}, {r['machine']['cores']}-core "
           f"{r['machine']['cpu']}, `benchmarks/spin.py`): the median of {r['rounds']} "
           f"processes a setting, each timing both side by side ({r['blocks']} alternating "
           "blocks); lower is better; busy: another process spinning on one core.", "",
           "| model | streams | " + " | ".join(k.replace(":", " ") for k in keys) + " |",
           "|---|---" + "|---" * len(keys) + "|"]
    for m in r["models"]:
        streams = re.search(r"on (\d+) stream", m["build"]["program"])
        best = {c: min(m["summary"][f"{c}:{s}"]["median_ratio"] for s in spins)
                for c in ("idle", "busy")}
        cells = []
        for k in keys:
            v = m["summary"][k]["median_ratio"]
            cells.append(f"**{v:.2f}**" if v == best[k.split(":")[0]] else f"{v:.2f}")
        out.append(f"| {m['model']} | {streams[1] if streams else '-'} | "
                   + " | ".join(cells) + " |")
    return out


def micro_lines(folder: Path) -> list[str] | None:
    out = []
    for name, key in (("roundtrip-cpu.json", "roundtrip_s"),
                      ("rules-match-cpu.json", "match_s")):
        result = _load(folder, name)
        if result is not None:
            row = next(x for x in result["results"] if x["model"] == "inception_v3")
            out.append(f"- {name.split('-cpu')[0]}: full inception_v3 {row[key]:.3f} s "
                       f"({_date(result)})")
    return out or None


def memory_table(r: dict) -> list[str]:
    """What a deployment pays in memory (``memory-cpu.json``, `benchmarks/memory.py`): each
    step's peak resident memory in a fresh process, the artifact against the weights."""
    imports = r["imports"]

    def mib(step: str) -> str:
        return str(imports.get(step, {}).get("peak_mib", "-"))

    own_rows = any("paragraph_load_own" in m for m in r["models"])
    out = [f"Peak resident MiB of a fresh process on the {r['machine']['cores']}-core "
           f"{r['machine']['cpu']} ({_date(r)}): ONNX Runtime's default session and "
           f"{r['runs']} runs; `paragraph.load` of the artifact and {r['runs']} runs, with "
           "TVM's runtime alone (`paragraph.lean`, the default where TVM is not imported yet) "
           "and with TVM whole (`PARAGRAPH_LEAN_LOAD=0`); `paragraph.build` with its defaults "
           f"and a fresh cost database. A bare `import onnxruntime` is "
           f"{mib('import_onnxruntime')} MiB, `import paragraph` {mib('import_paragraph')}, "
           f"`import tvm` {mib('import_tvm')} (its compiler, and PyTorch through TVM FFI), "
           f"TVM's runtime alone {mib('import_tvm_runtime')}."
           + (" *Own forms*: built and loaded with `PARAGRAPH_TORCH_FORMS=0`; *torch*: the "
              "load mapped libtorch_cpu (a kernel's chosen form is PyTorch's)."
              if own_rows else ""), "",
           "| model | weights MB | artifact MB (x weights) | ONNX Runtime | paragraph load "
           "(x ORT) | load, TVM whole (x ORT) | paragraph build |"
           + (" load, own forms (x ORT) |" if own_rows else ""),
           "|---|---|---|---|---|---|---|" + ("---|" if own_rows else "")]

    def peak(m: dict, step: str) -> str:
        v = m.get(step, {}).get("peak_mib")
        return "failed" if v is None else f"{v:,.0f}"

    def times(m: dict, key: str, step: str = "") -> str:
        torch = ", torch" if m.get(step, {}).get("libtorch") else ""
        return f" ({m[key]:.1f}x{torch})" if key in m else ""

    for m in r["models"]:
        art = (f"{m['artifact_mb']:.1f} ({m['artifact_vs_weights']:.2f}x)"
               if "artifact_mb" in m else "-")
        full = (f"{peak(m, 'paragraph_load_full')}{times(m, 'load_full_vs_onnxruntime')}"
                if "paragraph_load_full" in m else "-")
        line = (f"| {m['model']} | {m['weights_mb']:.1f} | {art} | {peak(m, 'onnxruntime')} "
                f"| {peak(m, 'paragraph_load')}"
                f"{times(m, 'load_vs_onnxruntime', 'paragraph_load')} | {full} "
                f"| {peak(m, 'paragraph_build')} |")
        if own_rows:
            own = (f"{peak(m, 'paragraph_load_own')}"
                   f"{times(m, 'load_own_vs_onnxruntime', 'paragraph_load_own')}"
                   if "paragraph_load_own" in m else "-")
            line += f" {own} |"
        out.append(line)
    return out


def longrun_table(r: dict) -> list[str]:
    """Memory and threads over many runs, loads and builds (``longrun-cpu.json``,
    `benchmarks/longrun.py`)."""
    out = [f"{r['model']} in one process ({_date(r)}): resident memory after the first tenth of "
           "each phase and at its end, and threads; a phase leaks when it grows more than "
           f"{r['leak_threshold_mib']:.0f} MiB or its threads grow. Wrong outputs: "
           f"{r['wrong_outputs']}; leaks: {', '.join(r['leaks']) or 'none'}.", "",
           "| phase | cycles | seconds | MiB after 1/10 | MiB at end | threads |",
           "|---|---|---|---|---|---|"]
    for name, p in r["phases"].items():
        out.append(f"| {name} | {p['cycles']:,} | {p['seconds']:.0f} | "
                   f"{p['rss_after_first_tenth_mib']:.0f} | {p['rss_end_mib']:.0f} | "
                   f"{p['threads_after_first_tenth']} -> {p['threads_end']} |")
    return out


# ------------------------------------------------------------------------------------- blocks
def _file(name: str, table: Callable[[dict], list[str]], intro: str = ""
          ) -> Callable[[Path], list[str] | None]:
    """A block rendering ``table`` of ``name`` (None when the file is absent); ``intro``, a
    format string over the file's machine (``{cpu}``, ``{cores}``), goes before it."""
    def render(folder: Path) -> list[str] | None:
        result = _load(folder, name)
        if result is None:
            return None
        head = [intro.format(**result["machine"], file=name), ""] if intro else []
        return head + table(result)
    return render


def _files(names: tuple[str, ...], table: Callable[[dict], list[str]]
           ) -> Callable[[Path], list[str] | None]:
    """One block of ``table`` for each of ``names`` that exists, each named before it."""
    def render(folder: Path) -> list[str] | None:
        out: list[str] = []
        for name in names:
            result = _load(folder, name)
            if result is not None:
                out += [f"`{name}` ({result['machine']['cores']}-core "
                        f"{result['machine']['cpu']}):", "", *table(result), ""]
        return out[:-1] or None
    return render


def _zoo(folder: Path) -> list[str] | None:
    result = _load(folder, "peers-cpu.json")
    return None if result is None else zoo_table(result, _load(folder, "peers-cpu-xeon.json"))


_NO_CORPUS = ("The public-model table (30+ public architectures against ONNX Runtime) comes "
              "with the corpus benchmark, which has not committed "
              "`benchmarks/results/corpus-cpu.json` yet; until then the README's Limits say "
              "where paragraph stands on public models.")


def _corpus(table: Callable[[dict], list[str]], waiting: str) -> Callable[[Path], list[str]]:
    """A block of ``table`` over ``corpus-cpu.json``, or ``waiting`` until it is there."""
    def render(folder: Path) -> list[str]:
        result = _load(folder, "corpus-cpu.json")
        return [waiting] if result is None else table(result)
    return render


def _xeon_peers(result: dict) -> list[str]:
    searched = any("search" in c for m in result["models"] for c in m["configs"])
    return ([f"On a {result['machine']['cores']}-core {result['machine']['cpu']} VM "
             f"(`peers-cpu-xeon.json`{'' if searched else ', no search rows'}):", ""]
            + peers_table(result))


_GPU = "On the lent GPU machine (one H100, {cpu} x{cores}; `{file}`):"

# name -> renderer; the order is `python benchmarks/report.py`'s and docs/performance.md's
BLOCKS: dict[str, Callable[[Path], list[str] | None]] = {
    "zoo": _zoo,
    "corpus": _corpus(corpus_table, _NO_CORPUS),
    "corpus-models": _corpus(corpus_models_table, "Every public model's row comes with "
                             "`benchmarks/results/corpus-cpu.json` (`benchmarks/corpus.py`)."),
    "corpus-avx2": _corpus_avx2,
    "corpus-zen3": _file("corpus-cpu-zen3.json", corpus_plain_avx2_table),
    "peers": _file("peers-cpu.json", peers_table),
    "peers-xeon": _file("peers-cpu-xeon.json", _xeon_peers),
    "kernel-classes": _file("kernel-classes-cpu.json", kernel_classes_table),
    "kernel-classes-xeon": _file("kernel-classes-cpu-xeon.json", kernel_classes_table,
                                 "On a {cores}-core {cpu} VM (`{file}`):"),
    "serving": _file("serving-cpu.json", serving_table),
    "team-binding": _file("team-binding-cpu.json", team_binding_table),
    "executor": _file("executor-cpu.json", executor_table),
    "schedules": _file("schedules-cpu.json", schedules_table),
    "kernels": _file("kernels-cpu.json", kernels_table),
    "search": _file("search-cpu.json", search_table),
    "regroup": _file("regroup-cpu.json", regroup_table),
    "costmodel": _file("costmodel-cpu.json", costmodel_table),
    "search-xeon": _file("search-cpu-xeon.json", search_table,
                         "On the {cores}-core {cpu} VM (`{file}`):"),
    "tuning": _file("tuning-cpu.json", tuning_table),
    "gpu-executor": _file("gpu-h100-executor.json", gpu_executor_table, _GPU),
    "gpu-search": _file("gpu-h100-search.json", search_table, _GPU),
    "peers-earlier": _files(("peers-nlp-cpu.json", "peers-search-cpu.json",
                             "peers-sru-cpu.json", "gpu-host-peers-cpu16.json"), peers_table),
    "refactor": _file("refactor-ab-cpu.json", refactor_table),
    "noise": _file("noise-cpu.json", noise_table),
    "refactor-house": _file("refactor-house-ab-cpu.json", house_ab_table),
    "micro": micro_lines,
    "memory": _file("memory-cpu.json", memory_table),
    "spin": _file("spin-cpu.json", spin_table),
    "longrun": _file("longrun-cpu.json", longrun_table),
}


def _wrap(lines: list[str]) -> list[str]:
    """Prose lines wrapped to `WIDTH` (a list item's continuation indented); table rows and
    blank lines as they are."""
    out: list[str] = []
    for line in lines:
        if not line or line.startswith("|") or len(line) <= WIDTH:
            out.append(line)
            continue
        indent = "  " if line.startswith("- ") else ""
        out += textwrap.wrap(line, WIDTH, subsequent_indent=indent, break_long_words=False,
                             break_on_hyphens=False)
    return out


def render(name: str, folder: Path = RESULTS) -> list[str]:
    """Block ``name``'s lines (a line saying its file is absent where it is)."""
    if name not in BLOCKS:
        raise KeyError(f"unknown report block {name!r}; known: {', '.join(BLOCKS)}")
    lines = BLOCKS[name](folder)
    return _wrap(lines if lines is not None else [f"(no results for `{name}` in {folder})"])


_MARKED = re.compile(r"(<!-- report:(?P<name>[\w-]+) -->\n)(?P<body>.*?)"
                     r"(<!-- /report:(?P=name) -->)", re.S)


def fill(text: str, folder: Path = RESULTS) -> str:
    """``text`` with every marked block replaced by what `render` gives now."""
    return _MARKED.sub(lambda m: m.group(1) + "\n" + "\n".join(render(m["name"], folder))
                       + "\n\n" + m.group(4), text)


def blocks(text: str) -> dict[str, str]:
    """The marked blocks of ``text``: name -> body."""
    return {m["name"]: m["body"] for m in _MARKED.finditer(text)}


def stale(path: Path, folder: Path = RESULTS) -> list[str]:
    """The names of ``path``'s marked blocks that differ from what `render` gives now."""
    text = path.read_text()
    now = blocks(fill(text, folder))
    return [name for name, body in blocks(text).items() if now[name] != body]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?", type=Path, default=RESULTS,
                        help="the folder of result JSON files (default: the committed ones)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true",
                      help="regenerate the marked blocks of README.md and docs/performance.md")
    mode.add_argument("--check", action="store_true",
                      help="exit 1 if a marked block differs from what it renders")
    mode.add_argument("--block", choices=list(BLOCKS), help="print one block")
    args = parser.parse_args(argv)
    if args.block:
        print("\n".join(render(args.block, args.results)))
        return 0
    if args.write or args.check:
        bad = []
        for page in PAGES:
            if not page.exists():
                parser.error(f"{page} is missing")
            names = stale(page, args.results)
            if args.write and names:
                page.write_text(fill(page.read_text(), args.results))
            bad += [f"{page.relative_to(ROOT)}: {name}" for name in names]
        verb = "rewrote" if args.write else "stale"
        for item in bad:
            print(f"{verb} {item}")
        return 1 if bad and args.check else 0
    out: list[str] = []
    for name in BLOCKS:
        if name == "zoo" or BLOCKS[name](args.results) is None:
            continue  # the README's narrow table repeats the peers table
        out += render(name, args.results) + [""]
    print("\n".join(out).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
