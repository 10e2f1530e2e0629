"""Markdown tables of the committed benchmark results (what the README's "Measured" quotes).

Usage: python benchmarks/report.py [benchmarks/results]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


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


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results")
    out: list[str] = []
    for name, table in (("executor-cpu.json", executor_table),
                        ("schedules-cpu.json", schedules_table),
                        ("kernels-cpu.json", kernels_table),
                        ("peers-cpu.json", peers_table),
                        # the same benchmark on another 2-core host (an Intel Xeon VM)
                        ("peers-cpu-xeon.json", peers_table),
                        ("serving-cpu.json", serving_table),
                        ("search-cpu.json", search_table),
                        ("regroup-cpu.json", regroup_table),
                        ("search-cpu-xeon.json", search_table),
                        # the lent GPU machine's runs (`tools/gpu/checks.sh`)
                        ("gpu-h100-executor.json", gpu_executor_table),
                        ("gpu-h100-search.json", search_table)):
        result = _load(folder, name)
        if result is not None:
            if name == "peers-cpu-xeon.json":
                searched = any("search" in c for m in result["models"] for c in m["configs"])
                out.append(f"On a {result['machine']['cores']}-core {result['machine']['cpu']} VM ("
                           f"`{name}`{'' if searched else ', no search rows'}):")
                out.append("")
            if name == "search-cpu-xeon.json":
                out.append(f"On the {result['machine']['cores']}-core {result['machine']['cpu']} "
                           f"VM (`{name}`):")
                out.append("")
            if name.startswith("gpu-"):
                out.append(f"On the lent GPU machine (one H100, {result['machine']['cpu']} "
                           f"x{result['machine']['cores']}; `{name}`):")
                out.append("")
            out += table(result) + [""]
    for name, key in (("roundtrip-cpu.json", "roundtrip_s"),
                      ("rules-match-cpu.json", "match_s")):
        result = _load(folder, name)
        if result is not None:
            row = next(x for x in result["results"] if x["model"] == "inception_v3")
            out.append(f"- {name.split('-cpu')[0]}: full inception_v3 {row[key]:.3f} s "
                       f"({_date(result)})")
    print("\n".join(out))


if __name__ == "__main__":
    main()
