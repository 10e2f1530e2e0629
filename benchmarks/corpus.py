"""Corpus benchmark (issue 52): paragraph against the CPU runtimes its users have, on public
architectures nobody here wrote (`corpus_models.SPECS`) and on the zoo's exports.

Usage::

    python benchmarks/corpus.py [--models a,b] [--kinds mobile,zoo,...] [--blocks N] [--block N]
                                [--no-search] [--search-budget S] [--search-method M]
                                [--timeout S] [--quiet-wait S] [--plot FILE]
                                [--json benchmarks/results/corpus-cpu.json] [--merge]
    python benchmarks/corpus.py --plot-only [--json FILE] [--plot FILE]

One row per model, each measured in a process of its own (the parent runs this script again
with ``--one NAME``; a model whose process fails, crashes or runs past ``--timeout`` gets a row
saying so and the run goes on). In that process, on one set of seeded inputs
(`corpus_models.example_inputs`):

* paragraph imports the ONNX file (``import_ok``) and builds it as `paragraph.build` does (the
  one compile path, `paragraph.planner.compile`, default options: vendor kernels where PyTorch
  is installed, the critical-path schedule), with a fresh cost database, so ``build_s`` is what
  a first build costs; with search, again with the AutoGraph substitution search
  (`SearchOptions`, ``--search-budget`` seconds, the search's candidate builds included);
* the peers: ONNX Runtime's default session (sequential executor, every core intra-op) and its
  parallel executor (every core inter-op, one intra-op), OpenVINO on the CPU (latency hint, f32
  inference precision: its default on this CPU is bf16, every core), and PyTorch eager on the
  model's own ``torch.nn.Module`` (`corpus_models.build`: the exported weights; every core,
  ``torch.inference_mode``); a zoo row's PyTorch is `peers.torch_from_onnx`, one torch call per
  ONNX node;
* every runtime's outputs against ONNX Runtime's: max |difference| / (max |ONNX Runtime| +
  1e-12) over the outputs; a row is ``equal`` when paragraph's (each of its configurations) is
  at most `TOLERANCE`, or, where it is more, at most `ROUNDING_FACTOR` times ONNX Runtime's own
  distance from paragraph's numpy interpreter of the model run in float64
  (``reference_rounding``: a deep model with random weights amplifies float32 rounding past
  any fixed tolerance; Inception-v4's ONNX Runtime outputs are 5.5e-4 from the float64 ones,
  OpenVINO's and PyTorch's 6.5-8.9e-4 from ONNX Runtime's);
* everything that ran, timed side by side in alternating blocks (`settle_and_time_in_blocks`),
  medians with p10/p90, the contention on the cores recorded before and after
  (`wait_for_quiet_cores`, `cpu_contention`; ``contended`` as peers.py flags it);
* the kernels by source (vendor, TVM tuned, TVM untuned), the peak resident memory after the
  builds and after the runs.

A configuration that fails (a peer that cannot load the model, paragraph's import or build)
leaves its error in the row's ``errors`` and the rest is still measured.

Under ``PARAGRAPH_CPU_ISA=avx2`` (the file's ``isa``) paragraph runs as on an AVX2-only CPU
(`paragraph.machine.forced_isa`: no own AVX-512 kernels, TVM compiled for a Haswell) and
oneDNN and MKL are held to AVX2 in the whole process (``ONEDNN_MAX_CPU_ISA``,
``MKL_ENABLE_INSTRUCTIONS``): PyTorch's, and OpenVINO is given the same variable (whether its
own oneDNN build honours it is not checked); ONNX Runtime's MLAS has no such limit and runs
with this CPU's AVX-512 (an unfair peer, reported as such)::

    PARAGRAPH_CPU_ISA=avx2 python benchmarks/corpus.py --no-search \\
        --json benchmarks/results/corpus-cpu-avx2.json

The results file (written atomically after each model, `paragraph.bench.bench_models`)::

    {"benchmark": "corpus", "blocks", "block", "tolerance", "timeout_s",
     "search": {"method", "budget_s"} | null, "versions": {package: version},
     "machine": {...}, "load_average_before", "load_average", "omp_wait_policy",
     "gomp_spincount", "failed": [],
     "models": [{
        "model", "kind", "package", "date", "load_average",
        "import_ok", "build_ok", "equal", "error" (the first fatal error, or null),
        "errors": {config: message},
        "inputs": [[shape, dtype]], "onnx_mb",
        "import_s", "build_s" (import and build, wall), "search_build_s",
        "kernels": {"vendor", "tvm_tuned", "tvm_untuned", "tuning_db"}, "search_kernels",
        "search": {"method", "budget_s", "rules", "seconds", "candidates_built",
                   "speedup"} | null,
        "max_rel_error": {config: float}, "reference_rounding" (only where paragraph's
        error exceeds TOLERANCE), "configs": [{"config", "median_ms", "p10_ms",
        "p90_ms", "runs", ...}],
        "onnxruntime_ms", "onnxruntime_parallel_ms", "openvino_ms", "pytorch_ms",
        "paragraph_ms", "paragraph_search_ms", "best_peer", "best_peer_ms",
        "paragraph_vs": {peer: peer_ms / paragraph_ms, "best_peer": ...},
        "paragraph_vs_onnxruntime", "paragraph_vs_best_peer", "search_vs_onnxruntime",
        "peak_rss_mb": {"after_build", "after_runs"},
        "contention_before", "contention_after", "contended", "wall_s"}]}

Ratios are speed ratios (above 1: paragraph faster); the best peer is the fastest of the f32
peers (both ONNX Runtime executors and OpenVINO). ``--plot-only`` draws the plot
(`benchmarks/results/corpus-cpu.png`: per model, paragraph against ONNX Runtime and against
the best peer, grouped by kind, log scale) from the JSON; a run draws it at the end.
`benchmarks/report.py` renders the README and docs tables from the JSON.
"""

from __future__ import annotations

# first, before TVM loads torch: paragraph sets libgomp's spin count (paragraph/__init__.py)
import paragraph  # noqa: F401

# isort: split
import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from importlib import metadata  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from corpus_models import BY_NAME, SPECS, example_inputs  # noqa: E402  (benchmarks/ on the path)

from paragraph.files import atomic_write_json  # noqa: E402
from paragraph.machine import cpu_count  # noqa: E402
from paragraph.progress import Log  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "corpus-cpu.json"
ZOO_PREFIX = "zoo:"
# the zoo's models as rows of kind "zoo" (nasnet_a_large, minutes a run on 2 cores, only when
# named: --models zoo:nasnet_a_large)
ZOO = ("inception_v3", "resnet50", "resnext50_32x4d", "nasnet_a_mobile", "squeezenet1_1",
       "randwire", "bert", "sru_rnntc")
KINDS = ("mobile", "branchy", "classic", "modern", "transformer", "recurrent", "zoo")
TOLERANCE = 1e-4  # max |difference| / max |ONNX Runtime's output|
PEERS = ("onnxruntime", "onnxruntime:parallel", "openvino", "pytorch")
F32_PEERS = ("onnxruntime", "onnxruntime:parallel", "openvino")
SEARCH_METHOD = "autograph"
SEARCH_BUDGET_S = 60.0  # per model: the whole corpus with search stays near two hours
TIMEOUT_S = 1800.0  # per model's process
VERSIONED = ("paragraph", "apache-tvm", "onnxruntime", "openvino", "torch", "torchvision",
             "timm", "transformers", "onnx", "numpy")


# ---------------------------------------------------------------------------- the models
def all_models() -> list[str]:
    """Every row's name in the file's order: the corpus, then the zoo's exports."""
    return [s.name for s in SPECS] + [ZOO_PREFIX + z for z in ZOO]


def describe(name: str) -> tuple[str, str]:
    """(kind, package) of a row."""
    if name.startswith(ZOO_PREFIX):
        return "zoo", "paragraph"
    spec = BY_NAME[name]
    return spec.kind, spec.package


def select(models: str, kinds: str) -> list[str]:
    """The rows ``--models`` and ``--kinds`` name (comma-separated; empty: all)."""
    names = models.split(",") if models else all_models()
    for n in names:
        if n not in BY_NAME and not (n.startswith(ZOO_PREFIX) and n != ZOO_PREFIX):
            raise SystemExit(f"unknown model {n!r}; corpus: {', '.join(BY_NAME)}; zoo: "
                             + ", ".join(ZOO_PREFIX + z for z in ZOO))
    if kinds:
        wanted = set(kinds.split(","))
        if wanted - set(KINDS):
            raise SystemExit(f"unknown kinds {sorted(wanted - set(KINDS))}; known: {KINDS}")
        names = [n for n in names if describe(n)[0] in wanted]
    return names


def onnx_file(name: str, workdir: Path) -> Path:
    """The model's ONNX file: the corpus's cached export, or the zoo module exported here as
    peers.py exports it (`kernels.to_onnx`)."""
    if not name.startswith(ZOO_PREFIX):
        from corpus_models import export

        return export(BY_NAME[name])
    from kernels import to_onnx

    from paragraph import models

    path = workdir / f"zoo-{name[len(ZOO_PREFIX):]}.onnx"
    path.write_bytes(to_onnx(models.get(name[len(ZOO_PREFIX):])))
    return path


# ---------------------------------------------------------------------------- measuring
def relative_error(expected: list, got: list) -> float:
    """max |got - expected| / (max |expected| + 1e-12), the worst over the outputs; inf where
    the counts or shapes differ or a value is not finite."""
    if len(expected) != len(got):
        return math.inf
    worst = 0.0
    for e, g in zip(expected, got, strict=True):
        e, g = np.asarray(e, np.float64), np.asarray(g, np.float64)
        if e.shape != g.shape:
            return math.inf
        if e.size == 0:
            continue
        err = float(np.max(np.abs(e - g)))
        if not math.isfinite(err):
            return math.inf
        worst = max(worst, err / (float(np.max(np.abs(e))) + 1e-12))
    return worst


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, MiB: its memory map's high-water mark
    (``VmHWM``), not ``ru_maxrss``, which Linux carries across exec from the forked parent."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def kernel_counts(program, tuning_db: str | None) -> dict:
    """The program's kernels by source. Which TVM kernels a tuning database covered is not
    kept per kernel (MetaScheduleApplyDatabase rewrites the matching functions inside
    lowering, `paragraph.tvm_interop.build.lowering`): with no database every TVM kernel is
    untuned, which is what these builds (paragraph's defaults) are; with one, the TVM kernels
    are counted as tuned, an upper bound."""
    sources = program.sources()
    tvm_kernels = sources.get("tvm", 0)
    return {"vendor": sources.get("vendor", 0),
            "tvm_tuned": tvm_kernels if tuning_db else 0,
            "tvm_untuned": 0 if tuning_db else tvm_kernels, "tuning_db": tuning_db}


def openvino_config(path: Path, inputs: list[np.ndarray]):
    """OpenVINO on the CPU: the latency hint, f32 inference precision (this CPU's default is
    bf16), every core; one infer request, inputs and outputs shared, not copied."""
    import openvino as ov

    from paragraph.timing import Config

    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU", {
        "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32",
        "INFERENCE_NUM_THREADS": cpu_count()})
    request = compiled.create_infer_request()
    feed = dict(enumerate(inputs))
    count = len(compiled.outputs)

    def run() -> list:
        request.infer(feed, share_inputs=True, share_outputs=True)
        return [request.get_output_tensor(i).data for i in range(count)]
    info = {"runtime": "openvino", "threads": cpu_count(),
            "precision": compiled.get_property("INFERENCE_PRECISION_HINT").to_string(),
            "hint": str(compiled.get_property("PERFORMANCE_HINT"))}
    return Config("openvino", run, info)


def torch_config(name: str, onnx_bytes: bytes | None, inputs: list[np.ndarray]):
    """PyTorch eager on every core: the spec's own module (`corpus_models.build`, the weights
    the export has), or for a zoo row the ONNX file node by node (`peers.torch_from_onnx`)."""
    from peers import torch_from_onnx, torch_module_runner

    from paragraph.timing import Config

    if name.startswith(ZOO_PREFIX):
        assert onnx_bytes is not None
        run = torch_from_onnx(onnx_bytes)
        how = "torch_from_onnx"
    else:
        from corpus_models import build

        module, _ = build(BY_NAME[name])
        run = torch_module_runner(module)
        how = "module"
    return Config("pytorch", lambda: run(*inputs),
                  {"runtime": "pytorch", "threads": cpu_count(), "eager": how})


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip()[:600]}"


MIN_BLOCK_S = 0.02  # a timed block of one configuration lasts at least this long
MAX_BLOCK = 50


def bench_one(name: str, args: argparse.Namespace, log: Log) -> dict:
    """One model's row (the module docstring), measured in this process."""
    from peers import ort_config

    from paragraph.bench import executor_config, settle_and_time_in_blocks
    from paragraph.deploy import ParallelExecutable
    from paragraph.machine import cpu_contention, is_contended, wait_for_quiet_cores
    from paragraph.passes.search import SearchOptions
    from paragraph.planner import CompileOptions, Session, compile
    from paragraph.progress import quiet
    from paragraph.tvm_interop.frontend.importers import load
    from paragraph.tvm_interop.frontend.relax_graph import from_relax
    from paragraph.tvm_interop.measure.costdb import CostDB
    from paragraph.tvm_interop.runtime.reference import ROUNDING_FACTOR, GraphReference

    start_all = time.perf_counter()
    kind, package = describe(name)
    row: dict = {"model": name, "kind": kind, "package": package, "import_ok": False,
                 "build_ok": False, "equal": False, "error": None, "errors": {}}
    workdir = Path(tempfile.mkdtemp(prefix="paragraph-corpus-"))
    try:
        path = onnx_file(name, workdir)
        inputs = example_inputs(path, seed=0)
    except Exception as exc:  # noqa: BLE001  no model, nothing to measure
        row.update(error=f"export: {_error(exc)}", errors={"export": _error(exc)},
                   wall_s=time.perf_counter() - start_all)
        log(f"{name}: export FAILED: {row['error']}")
        return row
    row.update(onnx_mb=round(path.stat().st_size / 1e6, 1),
               inputs=[[list(a.shape), str(a.dtype)] for a in inputs])
    configs: list = []

    def fail(config: str, exc: BaseException) -> None:
        row["errors"][config] = _error(exc)
        row["error"] = row["error"] or f"{config}: {row['errors'][config]}"
        log(f"{name}: {config} FAILED: {row['errors'][config]}")

    # paragraph first, so that the memory after its build is its own (and the libraries')
    session = Session(None, db=CostDB(workdir / "costs.sqlite"), log=quiet)
    start = time.perf_counter()
    mod = None
    try:
        mod = load(str(path))
        row["import_ok"] = True
        row["import_s"] = time.perf_counter() - start
        exe = ParallelExecutable.of(compile(mod, CompileOptions(), session=session))
        row["build_s"] = time.perf_counter() - start
        row["build_ok"] = True
        row["kernels"] = kernel_counts(exe.program, None)
        log(f"{name}: imported in {row['import_s']:.1f} s, built in {row['build_s']:.1f} s: "
            f"{exe!r}")
        c = executor_config(exe.program, exe.schedule, inputs)
        c.name = "paragraph"
        c.info.update(runtime="paragraph")
        configs.append(c)
    except Exception as exc:  # noqa: BLE001  the row records it; the peers are still timed
        fail("import" if not row["import_ok"] else "paragraph", exc)
    row["peak_rss_mb"] = {"after_build": round(peak_rss_mb(), 1)}
    row["search"] = None
    if row["build_ok"] and not args.no_search:
        options = SearchOptions(args.search_method, budget=args.search_budget)
        start = time.perf_counter()
        try:
            searched = ParallelExecutable.of(compile(mod, CompileOptions(search=options),
                                                     session=session))
            row["search_build_s"] = time.perf_counter() - start
            report = searched.report["search"]
            row["search"] = {"method": args.search_method, "budget_s": args.search_budget,
                             **{k: report[k] for k in ("rules", "seconds", "candidates_built",
                                                       "speedup")}}
            row["search_kernels"] = kernel_counts(searched.program, None)
            log(f"{name}: {args.search_method} search in {row['search_build_s']:.0f} s, "
                f"{len(report['rules'])} rewrites")
            if report["rules"]:
                c = executor_config(searched.program, searched.schedule, inputs)
                c.name = "paragraph:search"
                c.info.update(runtime="paragraph", search=args.search_method)
                configs.append(c)
            else:  # the input graph kept: the default row's program, its timing stands
                row["search"]["same_as"] = "paragraph"
        except Exception as exc:  # noqa: BLE001
            fail("paragraph:search", exc)
        row["peak_rss_mb"]["after_build"] = round(peak_rss_mb(), 1)
    onnx_bytes = path.read_bytes()
    try:
        ort = ort_config(onnx_bytes, inputs, parallel=False)
    except Exception as exc:  # noqa: BLE001  no reference: nothing to check against
        fail("onnxruntime", exc)
        row["wall_s"] = time.perf_counter() - start_all
        return row
    peers = [ort]
    for config, make in (("onnxruntime:parallel", lambda: ort_config(onnx_bytes, inputs, True)),
                         ("openvino", lambda: openvino_config(path, inputs)),
                         ("pytorch", lambda: torch_config(name, onnx_bytes, inputs))):
        try:
            peers.append(make())
        except Exception as exc:  # noqa: BLE001
            fail(config, exc)
    onnx_bytes = b""  # the sessions hold the model now
    configs = peers + configs
    try:
        expected = [np.asarray(a) for a in ort.run()]
    except Exception as exc:  # noqa: BLE001  no reference: nothing to check against
        fail("onnxruntime", exc)
        for c in configs:
            if c.close is not None:
                c.close()
        row["wall_s"] = time.perf_counter() - start_all
        return row
    row["max_rel_error"] = {"onnxruntime": 0.0}
    checked = [ort]
    for c in configs[1:]:
        try:
            row["max_rel_error"][c.name] = relative_error(expected, [np.asarray(a)
                                                                     for a in c.run()])
            checked.append(c)
        except Exception as exc:  # noqa: BLE001
            fail(c.name, exc)
    ours = [c.name for c in checked if c.name.startswith("paragraph")]
    allowed = TOLERANCE
    worst = max((row["max_rel_error"][n] for n in ours), default=0.0)
    if TOLERANCE < worst < math.inf and mod is not None:
        try:  # how far ONNX Runtime itself is from the model's values in float64
            wide = GraphReference(from_relax(mod)).outputs(inputs, wide=True)
            row["reference_rounding"] = relative_error(wide, expected)
            allowed = max(TOLERANCE, ROUNDING_FACTOR * row["reference_rounding"])
        except Exception as exc:  # noqa: BLE001  the fixed tolerance stands
            fail("reference_rounding", exc)
    row["equal"] = bool(ours) and all(row["max_rel_error"][n] <= allowed for n in ours)
    log(f"{name}: max relative error against ONNX Runtime: " + ", ".join(
        f"{k} {v:.2g}" for k, v in row["max_rel_error"].items() if k != "onnxruntime"))
    # a block lasts at least MIN_BLOCK_S of ONNX Runtime's runs: in blocks of 5 runs of the
    # 1 ms SRU, paragraph's first runs after another runtime's block were cold (median 3.0 ms,
    # p10 0.97); in blocks of 20, 1.01 ms
    once = float("inf")
    for _ in range(3):  # the fastest of three: a session's first run is slow
        start = time.perf_counter()
        ort.run()
        once = min(once, time.perf_counter() - start)
    block = max(args.block, min(MAX_BLOCK, math.ceil(MIN_BLOCK_S / once)))
    row["block"] = block
    before = wait_for_quiet_cores(log, args.quiet_wait)
    log(f"{name}: timing {len(checked)} configurations, {args.blocks} blocks of {block}")
    try:
        settle_and_time_in_blocks(checked, args.blocks, block)
    finally:
        timed = {id(c) for c in checked}
        for c in configs:  # the ones that failed their check were not closed there
            if id(c) not in timed and c.close is not None:
                c.close()
    after = cpu_contention(2.0)
    row["peak_rss_mb"]["after_runs"] = round(peak_rss_mb(), 1)
    rows = []
    for c in checked:
        r = c.row(None)
        del r["speedup_vs_tvm_vm"]
        rows.append(r)
    row["configs"] = rows
    ms = {r["config"]: r["median_ms"] for r in rows}
    if (row["search"] or {}).get("same_as") and "paragraph" in ms:
        ms["paragraph:search"] = ms["paragraph"]
    row.update(summary(ms))
    row.update(contention_before=before, contention_after=after,
               contended=is_contended(before, after), wall_s=time.perf_counter() - start_all)
    for r in rows:
        log(f"  {r['config']:22} {r['median_ms']:9.3f} ms ({r['p10_ms']:.3f}-{r['p90_ms']:.3f})")
    if row["contended"]:
        log(f"  FLAGGED: other work held a core around the timing ({before}, {after})")
    return row


def summary(ms: dict[str, float | None]) -> dict:
    """The row's flat medians and speed ratios from each configuration's median ms."""
    out: dict = {"onnxruntime_ms": ms.get("onnxruntime"),
                 "onnxruntime_parallel_ms": ms.get("onnxruntime:parallel"),
                 "openvino_ms": ms.get("openvino"), "pytorch_ms": ms.get("pytorch"),
                 "paragraph_ms": ms.get("paragraph"),
                 "paragraph_search_ms": ms.get("paragraph:search")}
    best = min(((ms[p], p) for p in F32_PEERS if ms.get(p) is not None), default=None)
    out["best_peer"], out["best_peer_ms"] = (best[1], best[0]) if best else (None, None)
    ours, searched = out["paragraph_ms"], out["paragraph_search_ms"]
    vs = {p: ms[p] / ours for p in PEERS if ours and ms.get(p) is not None}
    if ours and best:
        vs["best_peer"] = best[0] / ours
    out["paragraph_vs"] = vs
    out["paragraph_vs_onnxruntime"] = vs.get("onnxruntime")
    out["paragraph_vs_best_peer"] = vs.get("best_peer")
    out["search_vs_onnxruntime"] = (ms["onnxruntime"] / searched
                                    if searched and ms.get("onnxruntime") else None)
    return out


# ---------------------------------------------------------------------------- the parent
def child_command(name: str, args: argparse.Namespace, out: Path) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", name, "--row-out", str(out),
           "--blocks", str(args.blocks), "--block", str(args.block),
           "--search-budget", str(args.search_budget), "--search-method", args.search_method,
           "--quiet-wait", str(args.quiet_wait)]
    return cmd + (["--no-search"] if args.no_search else [])


def run_child(name: str, args: argparse.Namespace, log: Log) -> dict:
    """``name``'s row from a process of its own (its lines passed on, indented); a row with
    the error where that process fails, crashes or runs past ``args.timeout``."""
    kind, package = describe(name)
    start = time.perf_counter()
    tail: collections.deque[str] = collections.deque(maxlen=30)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "benchmarks")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                                 else []))
    with tempfile.TemporaryDirectory(prefix="paragraph-corpus-row-") as tmp:
        out = Path(tmp) / "row.json"
        proc = subprocess.Popen(child_command(name, args, out), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                env=env, cwd=ROOT, start_new_session=True)

        def forward() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                tail.append(line.rstrip())
                log("    " + line.rstrip())
        reader = threading.Thread(target=forward, daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=args.timeout)
            problem = None if code == 0 else (
                f"the process exited with {code}" if code > 0
                else f"the process was killed by {signal.Signals(-code).name}")
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the child and its helpers
            proc.wait()
            problem = f"timed out after {args.timeout:.0f} s"
        reader.join(timeout=10)
        if problem is None and out.exists():
            return json.loads(out.read_text())
    last = [line for line in tail if line.strip()][-5:]
    error = (problem or "the process wrote no row") + (": " + " | ".join(last) if last else "")
    log(f"{name}: FAILED: {error}")
    return {"model": name, "kind": kind, "package": package, "import_ok": None,
            "build_ok": None, "equal": None, "error": error[:1500], "errors": {},
            "crashed": True, "wall_s": time.perf_counter() - start}


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for package in VERSIONED:
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    return out


def _line(row: dict) -> str:
    """One finished model, said in a line."""
    name = row["model"]
    if row.get("paragraph_ms") is None:
        return f"{name}: no paragraph timing ({row.get('error') or 'see the row'})"
    best = row.get("best_peer")
    vs_best = (f", best f32 peer {best} {row['best_peer_ms']:.2f} ms "
               f"({row['paragraph_vs_best_peer']:.2f}x)") if best else ""
    ort = (f", ONNX Runtime {row['onnxruntime_ms']:.2f} ms "
           f"({row['paragraph_vs_onnxruntime']:.2f}x)") if row.get("onnxruntime_ms") else ""
    return (f"{name}: paragraph {row['paragraph_ms']:.2f} ms{ort}{vs_best}, "
            f"{'equal' if row['equal'] else 'NOT EQUAL'}, build {row['build_s']:.0f} s, "
            f"{row['wall_s']:.0f} s in all")


# ---------------------------------------------------------------------------- the plot
def plot(result: dict, out: str | os.PathLike) -> Path:
    """Per model, paragraph's speed ratio against ONNX Runtime's default session and against
    the best f32 peer, grouped by kind, log scale, a line at 1 (models without a paragraph
    timing have no bars, their name says why)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = sorted(result["models"], key=lambda m: (KINDS.index(m["kind"])
                                                    if m["kind"] in KINDS else len(KINDS)))
    fig, ax = plt.subplots(figsize=(max(8.0, 0.32 * len(rows) + 2), 5.5))
    x = np.arange(len(rows))
    width = 0.4
    for offset, key, label in ((-width / 2, "paragraph_vs_onnxruntime", "vs ONNX Runtime"),
                               (width / 2, "paragraph_vs_best_peer", "vs best f32 peer")):
        values = np.array([m.get(key) or np.nan for m in rows])
        ax.bar(x + offset, values - 1, width, bottom=1.0, label=label)  # from 1, up or down
    ax.set_yscale("log")
    ratios = [v for m in rows for k in ("paragraph_vs_onnxruntime", "paragraph_vs_best_peer")
              if (v := m.get(k))]
    low, high = min([0.5, *ratios]) / 1.25, max([2.0, *ratios]) * 1.25
    ax.set_ylim(low, high)
    ticks = [t for t in (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 10, 20) if low <= t <= high]
    ax.set_yticks(ticks, [f"{t:g}x" for t in ticks])
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(x, [m["model"] + ("" if m.get("paragraph_ms") else " (failed)")
                      for m in rows], rotation=75, ha="right", fontsize=7)
    ax.set_ylabel("speed ratio (peer ms / paragraph ms)")
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i]["kind"] != rows[start]["kind"]:
            if i < len(rows):
                ax.axvline(i - 0.5, color="grey", linewidth=0.5, linestyle="--")
            ax.text((start + i - 1) / 2, 1.01, rows[start]["kind"], ha="center", va="bottom",
                    transform=ax.get_xaxis_transform(), fontsize=8)
            start = i
    m0 = result["machine"]
    ax.set_title(f"paragraph against ONNX Runtime and the best f32 peer, {m0['cores']}-core "
                 f"{m0['cpu']}, {m0['date'][:10]}", fontsize=9, pad=16)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--models", default="", help="comma-separated rows (default: all; "
                        f"the zoo's as {ZOO_PREFIX}NAME)")
    parser.add_argument("--kinds", default="", help=f"comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--blocks", type=int, default=8, help="alternating blocks")
    parser.add_argument("--block", type=int, default=5,
                        help="timed runs a block, at least (a block lasts MIN_BLOCK_S or more)")
    parser.add_argument("--no-search", action="store_true",
                        help="skip paragraph with the substitution search")
    parser.add_argument("--search-budget", type=float, default=SEARCH_BUDGET_S,
                        help="seconds of search per model (candidate builds included)")
    parser.add_argument("--search-method", default=SEARCH_METHOD,
                        choices=("greedy", "taso", "autograph"))
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S,
                        help="seconds a model's process may take")
    parser.add_argument("--quiet-wait", type=float, default=120.0,
                        help="seconds to wait for other processes to leave the cores before "
                             "timing (then timed anyway, and flagged)")
    parser.add_argument("--plot", default=None,
                        help="the plot (default: the --json file's name, .png)")
    parser.add_argument("--plot-only", action="store_true",
                        help="draw the plot from the --json file and stop")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a model's own process
    parser.add_argument("--row-out", help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None,
                        help=f"the results file (default: {RESULTS.relative_to(ROOT)})")
    parser.add_argument("--merge", action="store_true",
                        help="keep the rows of an existing --json file that this run does not "
                             "measure (each row records its own date and load)")
    args = parser.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)

    if args.one:
        row = bench_one(args.one, args, log)
        atomic_write_json(args.row_out, row)
        return
    out = Path(args.json) if args.json else RESULTS
    picture = Path(args.plot) if args.plot else out.with_suffix(".png")
    if args.plot_only:
        log(f"wrote {plot(json.loads(out.read_text()), picture)}")
        return
    names = select(args.models, args.kinds)
    done = iter(range(1, len(names) + 1))

    def one(name: str) -> dict:
        kind = describe(name)[0]
        log(f"[{next(done)}/{len(names)}] {name} ({kind})")
        row = run_child(name, args, log)
        log(_line(row))
        return row

    from paragraph.bench import bench_models  # TVM loads here, not in the tests' import

    search = None if args.no_search else {"method": args.search_method,
                                          "budget_s": args.search_budget}
    from paragraph.machine import forced_isa

    bench_models(names, one, str(out), {
        "benchmark": "corpus", "isa": forced_isa(), "blocks": args.blocks, "block": args.block,
        "tolerance": TOLERANCE, "timeout_s": args.timeout, "search": search,
        "versions": versions(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT")},
        merge=args.merge, log=log, order=all_models())
    log(f"wrote {plot(json.loads(out.read_text()), picture)}")


if __name__ == "__main__":
    main()
