"""Where the time goes, by kernel class (issue 17): paragraph's kernels against ONNX Runtime's
own profiler, on 1 thread and on 2, side by side in one process.

Usage: python benchmarks/kernel_classes.py [--models bert,encoder] [--threads 1,2] [--runs N]
           [--blocks N] [--reduced] [--per-node CLASS] [--as-imported]
           [--json benchmarks/results/kernel-classes-cpu.json]

Per model and thread count: paragraph's executor (vendor kernels, the model's graph with the
rewrite the default plan applies, average pools moved after the 1 x 1 convolutions that narrow
them, `paragraph.passes.pools`; ``--as-imported`` for the model's own graph; the sequential
schedule with that many threads, profiled: each kernel's median over ``runs``) and ONNX
Runtime's sequential executor with that many intra-op threads and its profiler on (each node's
median ``kernel_time`` over the same runs, first two of each dropped), a pause between the
blocks (ORT's pool threads spin after its runs and took the second core from paragraph's next
block), both summed by kernel class: convolution, matrix product, softmax, layer norm, GELU,
pooling, concatenation, data movement (transposes, reshapes, slices, gathers), element-wise.
Whole runs of each are reported beside the kernels' sum (paragraph's timed without the profile,
ORT's as its profiler timed them): the difference is what a run spends outside its kernels. The
two runtimes fuse differently (ORT's FusedConv carries the activation, paragraph's vendor
products their bias and GELU), so a class is compared as a whole, not per node; and where
paragraph's kernel of one class does the work of an ORT node of another (NASNet's joins apply
the relu that ORT runs after its Concat), that node counts in paragraph's class. Runs alternate
between the runtimes in blocks; the contention on the cores is recorded and a model timed while
another process held a core is flagged.

A class's total moves 10-20% between runs minutes apart (the host's phases); with
``--per-node CLASS`` each node of that class is also reported, both runtimes', in the order they
ran (paired where they ran as many), which is how a class's gap is traced to its nodes.
"""

from __future__ import annotations

# first, before TVM loads torch: paragraph sets libgomp's spin count (paragraph/__init__.py)
import paragraph  # noqa: F401

# isort: split
import argparse  # noqa: E402
import json  # noqa: E402
import os
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from peers import model_and_onnx, profiled_runs  # noqa: E402  (benchmarks/ is on the path as a script)

from paragraph.files import atomic_write_json  # noqa: E402
from paragraph.machine import (  # noqa: E402
    cpu_contention,
    describe_machine,
    is_contended,
    wait_for_quiet_cores,
)
from paragraph.passes.pools import pools_after_convs  # noqa: E402
from paragraph.passes.schedule import make_schedule  # noqa: E402
from paragraph.tvm_interop import random_inputs  # noqa: E402
from paragraph.tvm_interop.build.program import build_program  # noqa: E402
from paragraph.tvm_interop.frontend.importers import prepare  # noqa: E402
from paragraph.tvm_interop.frontend.relax_graph import from_relax, to_relax  # noqa: E402
from paragraph.tvm_interop.measure.device import SETTLE_RUNS  # noqa: E402
from paragraph.tvm_interop.runtime.executor import make_executor  # noqa: E402
from paragraph.tvm_interop.runtime.library.names import VendorOp, is_vendor_name  # noqa: E402
from paragraph.tvm_interop.runtime.target import resolve_target  # noqa: E402

# class, words of an ORT op type or a TVM fused function's name (first match wins)
CLASSES = (("convolution", ("conv",)), ("product", ("matmul", "gemm", "bmm", "dense")),
           ("layer_norm", ("layer_norm", "layernorm")), ("softmax", ("softmax",)),
           ("gelu", ("gelu", "erf")), ("pooling", ("pool",)), ("concat", ("concat",)),
           ("data_movement", ("transpose", "permute", "reshape", "slice", "split", "gather",
                              "take", "copy", "expand", "squeeze")))
WARMUP = 2
SETTLE_S = 0.2  # pause between the runtimes' blocks


def kernel_class(name: str) -> str:
    """The class of an ORT op type, a vendor kernel or a TVM fused function name."""
    if is_vendor_name(name):
        name = VendorOp.from_name(name).kind
    low = name.lower()
    for cls, words in CLASSES:
        if any(w in low for w in words):
            return cls
    return "elementwise"


def named_nodes(onnx_bytes: bytes) -> bytes:
    """The model with every unnamed node named ``{op}_{index}``: ORT's profiler reports nodes
    by name, and a name it makes up itself is lost from the optimised graph it saves."""
    import onnx

    model = onnx.load_from_string(onnx_bytes)
    for i, node in enumerate(model.graph.node):
        node.name = node.name or f"{node.op_type}_{i}"
    return model.SerializeToString()


def carried_by_paragraph(onnx_bytes: bytes) -> dict[str, str]:
    """ORT node name -> the class of the paragraph kernel that does its work, for ORT nodes
    whose work paragraph fuses into a kernel of another class: a Relu that reads a Concat's
    output (NASNet's cells), which paragraph's join applies as it copies. Read from the graph
    ORT runs (its optimisations applied, in a session of its own, not the one timed)."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        options.log_severity_level = 3  # its warning that the file is for this machine only
        ort.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"])
        graph = onnx.load(options.optimized_model_filepath).graph
    producer = {out: node.op_type for node in graph.node for out in node.output}
    return {node.name: "concat" for node in graph.node
            if node.op_type == "Relu" and producer.get(node.input[0]) == "Concat"}


def ort_profile(onnx_bytes: bytes, inputs: list[np.ndarray], threads: int, blocks: int,
                runs: int, between, carried: dict[str, str],
                per_node: str | None = None) -> tuple[dict[str, float], list[dict], float]:
    """Median ms per ORT node kind summed by class, from its profiler over ``blocks`` x
    ``runs`` runs of ``onnx_bytes`` (its nodes named: `named_nodes`); ``between()`` runs after
    each block (the other runtime's block). A node of ``carried`` (`carried_by_paragraph`)
    counts in the class it maps to. Also each node of class ``per_node`` in the order ORT ran
    them: its name, op, output shape and median ms; and the median ms of a whole run, as its
    profiler timed them (`session.run` to the outputs)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
    session = ort.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(session.get_inputs(), inputs, strict=True)}
    for _ in range(WARMUP):
        session.run(None, feed)
    for _ in range(blocks):
        for _ in range(runs):
            session.run(None, feed)
        time.sleep(SETTLE_S)  # ORT's pool threads spin after a run: not into the other block
        between()
        time.sleep(SETTLE_S)
    with open(session.end_profiling()) as f:
        events = json.load(f)
    durations: dict[str, list[float]] = {}  # in the order ORT first ran the nodes
    kind: dict[str, str] = {}
    shape: dict[str, list] = {}
    runs_us = [e["dur"] for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    run_ms = statistics.median(runs_us[WARMUP:] or runs_us) / 1e3 if runs_us else float("nan")
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            durations.setdefault(e["name"], []).append(e["dur"] / 1e3)
            kind[e["name"]] = e["args"]["op_name"]
            shape[e["name"]] = [list(t.values())[0] for t in e["args"].get("output_type_shape", [])]
    out: dict[str, float] = {}
    nodes: list[dict] = []
    for node, durs in durations.items():
        cls = carried.get(node.removesuffix("_kernel_time")) or kernel_class(kind[node])
        ms = statistics.median(durs[WARMUP:] or durs)
        out[cls] = out.get(cls, 0.0) + ms
        if cls == per_node:
            nodes.append({"name": node.removesuffix("_kernel_time"), "op": kind[node],
                          "shape": shape[node], "ms": ms})
    return out, nodes, run_ms


def bench_model(name: str, args, log) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        mod, onnx_bytes, _ = model_and_onnx(name, args.reduced, Path(tmp))
    done: list[str] = []
    if not args.as_imported:  # the graph the default (critical-path) plan runs
        moved, done = pools_after_convs(from_relax(prepare(mod)))
    program = build_program(to_relax(moved) if done else mod, resolve_target("cpu"),
                                  kernels="vendor", rewrites=tuple(done))
    inputs = random_inputs(mod)
    onnx_bytes = named_nodes(onnx_bytes)
    carried = carried_by_paragraph(onnx_bytes)
    row: dict = {"model": name, "rewrites": list(program.rewrites), "threads": {}}
    before = wait_for_quiet_cores(log)
    for threads in args.threads:
        schedule = make_schedule("sequential", program.graph, cores=threads)
        samples: dict[int, list[float]] = {}
        runs: list[float] = []  # paragraph's whole runs, not profiled, ms

        def timed_runs(executor, samples=samples, runs=runs) -> None:
            profiled_runs(executor, inputs, args.runs, samples)
            for _ in range(args.runs):  # its profile costs after the run: timed without
                start = time.perf_counter()
                executor.run(*inputs)
                runs.append((time.perf_counter() - start) * 1e3)
        with make_executor(program, schedule) as executor:
            # past the vendor kernels' timing of their forms (up to four per convolution, five
            # calls each): two warm-ups profiled those calls, the slower forms' among them
            for _ in range(SETTLE_RUNS):
                executor.run(*inputs)
            ort, ort_nodes, ort_run = ort_profile(
                onnx_bytes, inputs, threads, args.blocks, args.runs,
                lambda ex=executor: timed_runs(ex), carried, args.per_node)
        ours: dict[str, float] = {}
        our_nodes: list[dict] = []
        for node in schedule.kernels:  # one stream: the order the kernels ran in
            if node not in samples:
                continue
            func = program.graph[node].attrs.get("func") or program.graph[node].name or ""
            cls = kernel_class(func)
            ms = statistics.median(samples[node])
            ours[cls] = ours.get(cls, 0.0) + ms
            if cls == args.per_node:
                our_nodes.append({"node": node, "kernel": func,
                                  "shape": list(program.graph[node].outputs[0].shape), "ms": ms})
        classes = sorted(set(ours) | set(ort), key=lambda c: -max(ours.get(c, 0), ort.get(c, 0)))
        our_run = statistics.median(runs)
        row["threads"][str(threads)] = {
            "paragraph_ms": {c: ours.get(c, 0.0) for c in classes},
            "onnxruntime_ms": {c: ort.get(c, 0.0) for c in classes},
            "paragraph_total_ms": sum(ours.values()), "onnxruntime_total_ms": sum(ort.values()),
            # whole runs (paragraph's unprofiled, ORT's `model_run` as its profiler timed
            # it): what a run spends outside its kernels (input copy, binding, hand-offs) is
            # about run less total; ORT's profiler adds to its kernels and its runs
            "paragraph_run_ms": our_run, "onnxruntime_run_ms": ort_run}
        log(f"{name}, {threads} thread(s): paragraph {sum(ours.values()):.2f} ms of kernels "
            f"in runs of {our_run:.2f}, ONNX Runtime {sum(ort.values()):.2f} in runs of "
            f"{ort_run:.2f} (its profiler's)")
        for c in classes:
            log(f"  {c:14} {ours.get(c, 0.0):8.3f} {ort.get(c, 0.0):8.3f}")
        if args.per_node:
            row["threads"][str(threads)]["per_node"] = {
                "class": args.per_node, "paragraph": our_nodes, "onnxruntime": ort_nodes}
            log_per_node(our_nodes, ort_nodes, log)
    after = cpu_contention(2.0)
    row.update(contention_before=before, contention_after=after,
               contended=is_contended(before, after))
    return row


def log_per_node(ours: list[dict], theirs: list[dict], log) -> None:
    """Each runtime's nodes of one class in the order they ran, side by side where the two
    ran as many (paired by position: compare the shapes), else one list after the other."""
    if len(ours) == len(theirs):
        for a, b in zip(ours, theirs, strict=True):
            log(f"    %{a['node']:<5} {str(tuple(a['shape'])):20} {a['ms'] * 1e3:8.1f} us   "
                f"{b['op']:18} {str(tuple(b['shape'][0]) if b['shape'] else ()):20} "
                f"{b['ms'] * 1e3:8.1f} us")
        return
    log(f"    paragraph ran {len(ours)} kernels of the class, ONNX Runtime {len(theirs)} nodes")
    for a in ours:
        log(f"    paragraph %{a['node']:<5} {str(tuple(a['shape'])):20} {a['ms'] * 1e3:8.1f} us")
    for b in theirs:
        log(f"    onnxruntime {b['op']:18} {str(b['shape']):24} {b['ms'] * 1e3:8.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert,encoder,resnet50,inception_v3")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--runs", type=int, default=4, help="runs per block")
    parser.add_argument("--reduced", action="store_true")
    parser.add_argument("--per-node", metavar="CLASS",
                        help="also each node of this class (pooling, softmax, ...), both "
                             "runtimes', in the order they ran")
    parser.add_argument("--as-imported", action="store_true",
                        help="the model's own graph, without the pools moved after their 1 x 1 "
                             "convolutions (what ONNX Runtime runs, kernel for kernel)")
    parser.add_argument("--json", default=str(Path(__file__).parent / "results"
                                              / "kernel-classes-cpu.json"))
    args = parser.parse_args()
    args.threads = [int(t) for t in args.threads.split(",")]

    def log(msg: str) -> None:
        print(msg, flush=True)

    load_before = os.getloadavg()
    results = []
    for m in args.models.split(","):
        results.append(bench_model(m, args, log))
        atomic_write_json(args.json, {
            "benchmark": "kernel-classes", "kernels": "vendor", "schedule": "sequential",
            "machine": describe_machine(), "blocks": args.blocks, "runs": args.runs,
            "reduced": args.reduced, "as_imported": args.as_imported,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
            "load_average_before": load_before, "load_average": os.getloadavg(),
            "models": results})
        log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
