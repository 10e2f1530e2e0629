"""Peers benchmark (issue 17): paragraph against the runtimes its users already have, side by side
in one process on this machine's CPU.

Usage: python benchmarks/peers.py [--models a,b] [--blocks N] [--block N] [--reduced]
                                  [--schedules sequential,critical-path,opara,wavefront]
                                  [--search greedy --search-budget S --top-k K]
                                  [--json benchmarks/results/peers-cpu.json] [--merge]

Per model: ONNX Runtime's sequential executor (2 intra-op threads, its default optimisations),
ONNX Runtime's parallel executor (2 inter-op x 1 intra-op threads), PyTorch eager (2 threads,
channels-last, batch norm folded into the convolutions as `torch.fx`'s fuser does; the encoder
runs as its own torch module), the TVM VM with paragraph's vendor kernels, and paragraph's
executor under each schedule (its best is the fastest of them), and with ``--search`` the graph
that substitution search picks, under critical-path. The zoo's Relax models are
exported to ONNX here; the BERT-style encoder (token ids in) is exported by torch and imported
by paragraph like a user's file. Every configuration's outputs are checked against ONNX
Runtime's, then all are timed in alternating blocks (`time_in_blocks`), medians with p10/p90.
The contention on the cores (other processes, steal) is recorded before and after each model's
timing; a model timed while another process held a core is flagged ``contended`` (and the
README's table marks it): such a comparison misled this project once already.

Each model's bound: the 1-thread kernel times (paragraph's sequential schedule, profiled) summed
and spread over the cores, and its critical path; no schedule of these kernels can beat the
larger of the two.

Targets (issue 17): paragraph's best at least 1.0x ONNX Runtime's sequential latency on every
model, and at least 1.15x on the branchy networks (inception_v3, nasnet_a_mobile, randwire).
"""

from __future__ import annotations

# first, before TVM loads torch: paragraph sets libgomp's spin count (paragraph/__init__.py)
import paragraph  # noqa: F401

# isort: split
import argparse  # noqa: E402
import os
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from kernels import to_onnx  # noqa: E402  (benchmarks/ is on the path when run as a script)

from paragraph import models  # noqa: E402
from paragraph.bench import (  # noqa: E402
    add_results_options,
    bench_models,
    executor_config,
    results_path,
    settle_and_time_in_blocks,
    vm_config,
)
from paragraph.machine import (  # noqa: E402
    cpu_contention,
    cpu_count,
    is_contended,
    wait_for_quiet_cores,
)
from paragraph.outputs import max_difference  # noqa: E402
from paragraph.passes.search import METHODS, SearchOptions  # noqa: E402
from paragraph.planner import (  # noqa: E402
    CompileOptions,
    Session,
    compile,
    plan_schedule,
    search_plan,
)
from paragraph.timing import Config  # noqa: E402
from paragraph.tvm_interop import from_relax, random_inputs  # noqa: E402
from paragraph.tvm_interop.frontend.importers import load  # noqa: E402
from paragraph.tvm_interop.measure.costdb import CostDB  # noqa: E402
from paragraph.tvm_interop.measure.device import SETTLE_RUNS  # noqa: E402
from paragraph.tvm_interop.runtime.executor import make_executor  # noqa: E402
from paragraph.tvm_interop.runtime.program import KernelProgram  # noqa: E402
from paragraph.tvm_interop.runtime.threads import config_threads  # noqa: E402

MODELS = ("inception_v3", "nasnet_a_mobile", "randwire", "resnet50", "bert", "sru_rnntc",
          "encoder")
BRANCHY = ("inception_v3", "nasnet_a_mobile", "randwire")
SCHEDULES = ("sequential", "critical-path", "opara", "wavefront")
TOLERANCE = 1e-3  # another runtime, another rounding (relative to 1 + |expected|)


# ---------------------------------------------------------------------------- the peers
def ort_session(onnx_bytes: bytes, parallel: bool):
    """ONNX Runtime on the CPU with its default optimisations: the sequential executor on
    every core, or the parallel executor with one thread per operator on every core."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if parallel:
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        options.inter_op_num_threads, options.intra_op_num_threads = cpu_count(), 1
    else:
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.intra_op_num_threads = cpu_count()
    return ort.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"])


def ort_config(onnx_bytes: bytes, inputs: list[np.ndarray], parallel: bool) -> Config:
    session = ort_session(onnx_bytes, parallel)
    feed = {i.name: a for i, a in zip(session.get_inputs(), inputs, strict=True)}
    name = "onnxruntime:parallel" if parallel else "onnxruntime"
    return Config(name, lambda: session.run(None, feed),
                  {"runtime": "onnxruntime", "threads": cpu_count()})


def _torch_threads() -> Callable[[], None]:
    """A call that gives torch every core again: paragraph's 1-thread streams may have set
    fewer (``torch.set_num_threads`` is process-wide with libgomp)."""
    import torch

    def ensure() -> None:
        if torch.get_num_threads() != cpu_count():
            torch.set_num_threads(cpu_count())
    return ensure


def torch_from_onnx(onnx_bytes: bytes) -> Callable[..., list]:
    """PyTorch eager for an ONNX model of the operators `to_onnx` writes: one torch call per
    node, 4-d tensors channels-last (oneDNN's fast layout, 1.6x over NCHW here), batch norm
    folded into the convolution it follows. Returns a function of numpy inputs."""
    import onnx
    import torch
    import torch.nn.functional as F  # noqa: N812
    from onnx import numpy_helper

    model = onnx.load_from_string(onnx_bytes)
    graph = model.graph
    consts = {i.name: np.array(numpy_helper.to_array(i)) for i in graph.initializer}
    uses: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1

    def attr(node, name, default=None):
        for a in node.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    def cl(t):
        return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t

    def const(name):
        return cl(torch.from_numpy(np.array(consts[name])))

    def pads2d(node, fill: float = 0.0):
        """(torch padding, pre-pad): TF-style "same" pads (NASNet) differ before and after,
        which torch's symmetric padding cannot say; they become an explicit pad first."""
        p = list(attr(node, "pads", [0, 0, 0, 0]))
        if p[:2] == p[2:]:
            return p[:2], None
        top, left, bottom, right = p
        return [0, 0], lambda x: F.pad(x, (left, right, top, bottom), value=fill)

    steps: list[tuple[Callable, list[str], str]] = []
    producer: dict[str, int] = {}  # output name -> index of its step (for the batch-norm fold)
    conv_weights: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for node in graph.node:
        op, ins, out = node.op_type, list(node.input), node.output[0]
        if op == "BatchNormalization" and ins[0] in producer and uses[ins[0]] == 1 \
                and producer[ins[0]] in conv_weights:
            k = producer[ins[0]]
            w, b = conv_weights[k]
            scale, shift, mean, var = (consts[i] for i in ins[1:5])
            s = scale / np.sqrt(var + attr(node, "epsilon", 1e-5))
            conv_weights[k] = (w * s[:, None, None, None], (b - mean) * s + shift)
            fn, conv_ins, _ = steps[k]
            steps[k] = (fn, conv_ins, out)
            producer[out] = k
            continue
        fn: Callable
        if op == "Conv":
            w = consts[ins[1]]
            conv_weights[len(steps)] = (w, consts[ins[2]] if len(ins) > 2 else
                                        np.zeros(w.shape[0], np.float32))
            fn = _conv(node, attr, pads2d)
            ins = ins[:1]
        elif op == "BatchNormalization":
            mean, var, scale, shift = (torch.from_numpy(consts[i])
                                       for i in (ins[3], ins[4], ins[1], ins[2]))
            eps = attr(node, "epsilon", 1e-5)
            fn = lambda x, m=mean, v=var, s=scale, b=shift, e=eps: F.batch_norm(  # noqa: E731
                x, m, v, s, b, False, 0.0, e)
            ins = ins[:1]
        elif op in ("MaxPool", "AveragePool"):
            include = bool(attr(node, "count_include_pad", 0))
            padding, pre = pads2d(node, float("-inf") if op == "MaxPool" else 0.0)
            kw = dict(kernel_size=list(attr(node, "kernel_shape")),
                      stride=list(attr(node, "strides", [1, 1])), padding=padding,
                      ceil_mode=bool(attr(node, "ceil_mode", 0)))
            pool = F.max_pool2d if op == "MaxPool" else partial(F.avg_pool2d,
                                                                 count_include_pad=include)
            if pre is not None and op == "AveragePool" and not include:
                fn = _avg_pool_uncounted(pre, kw)
            elif pre is None:
                fn = lambda x, kw=kw, pool=pool: pool(x, **kw)  # noqa: E731
            else:
                fn = lambda x, kw=kw, pool=pool, pre=pre: pool(pre(x), **kw)  # noqa: E731
        elif op == "Pad":
            p = [int(v) for v in consts[ins[1]]]
            half = len(p) // 2
            torch_pads = [v for axis in reversed(range(half)) for v in (p[axis], p[axis + half])]
            fn = lambda x, tp=torch_pads: F.pad(x, tp)  # noqa: E731
            ins = ins[:1]
        elif op == "GlobalAveragePool":
            fn = lambda x: x.mean((2, 3), keepdim=True)  # noqa: E731
        elif op == "Concat":
            fn = lambda *xs, a=attr(node, "axis"): torch.cat(xs, a)  # noqa: E731
        elif op == "Reshape":
            shape = [int(v) for v in consts[ins[1]]]
            fn = lambda x, s=shape: x.reshape(s)  # noqa: E731
            ins = ins[:1]
        elif op == "Transpose":
            fn = lambda x, p=list(attr(node, "perm")): x.permute(p)  # noqa: E731
        elif op == "Slice":
            starts, ends, axes, steps_ = (consts[i].tolist() for i in ins[1:5])
            index: list[slice] = []
            for a, s, e, st in sorted(zip(axes, starts, ends, steps_, strict=True)):
                index += [slice(None)] * (a - len(index)) + [slice(s, e, st)]
            fn = lambda x, ix=tuple(index): x[ix]  # noqa: E731
            ins = ins[:1]
        elif op == "Softmax":
            fn = lambda x, a=attr(node, "axis", -1): torch.softmax(x, a)  # noqa: E731
        elif op == "LayerNormalization":
            scale, shift = torch.from_numpy(consts[ins[1]]), torch.from_numpy(consts[ins[2]])
            fn = lambda x, s=scale, b=shift, e=attr(node, "epsilon", 1e-5): F.layer_norm(  # noqa: E731
                x, s.shape, s, b, e)
            ins = ins[:1]
        elif op in ("MatMul", "Add", "Mul", "Sub", "Div"):
            fn = {"MatMul": torch.matmul, "Add": torch.add, "Mul": torch.mul,
                  "Sub": torch.sub, "Div": torch.div}[op]
        elif op in ("Relu", "Sigmoid", "Tanh"):
            fn = {"Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh}[op]
        elif op == "Gelu":
            fn = lambda x, a=attr(node, "approximate", "none"): F.gelu(x, approximate=a)  # noqa: E731
        else:
            raise NotImplementedError(f"no torch eager for ONNX {op}")
        producer[out] = len(steps)
        steps.append((fn, ins, out))
    # weights (and batch-norm folds) are final now: make the convolution weights once
    for k, (w, b) in conv_weights.items():
        fn, ins, out = steps[k]
        steps[k] = (partial_conv(fn, cl(torch.from_numpy(np.ascontiguousarray(w, np.float32))),
                                 torch.from_numpy(np.ascontiguousarray(b, np.float32))), ins, out)
    values0 = {name: const(name) for name in consts}
    inputs = [i.name for i in graph.input if i.name not in consts]
    outputs = [o.name for o in graph.output]
    ensure_threads = _torch_threads()

    def run(*arrays: np.ndarray) -> list:
        ensure_threads()
        with torch.inference_mode():
            values = dict(values0)
            for name, a in zip(inputs, arrays, strict=True):
                values[name] = cl(torch.from_numpy(a))
            for fn, ins, out in steps:
                values[out] = fn(*(values[i] for i in ins))
            return [values[o] for o in outputs]
    return run


def _avg_pool_uncounted(pre: Callable, kw: dict) -> Callable:
    """An average pool whose asymmetric pads do not count: the pool of the padded input over
    the pool of padded ones (a constant per shape, made once)."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    divisors: dict[tuple[int, ...], object] = {}

    def pool(x):
        key = tuple(x.shape)
        if key not in divisors:
            divisors[key] = F.avg_pool2d(pre(torch.ones_like(x)), **kw)
        return F.avg_pool2d(pre(x), **kw) / divisors[key]
    return pool


def _conv(node, attr, pads2d) -> Callable:
    import torch.nn.functional as F  # noqa: N812

    stride, dilation = list(attr(node, "strides", [1, 1])), list(attr(node, "dilations", [1, 1]))
    (padding, pre), groups = pads2d(node), attr(node, "group", 1)
    if pre is None:
        return lambda x, w, b: F.conv2d(x, w, b, stride, padding, dilation, groups)
    return lambda x, w, b: F.conv2d(pre(x), w, b, stride, padding, dilation, groups)


def partial_conv(fn: Callable, w, b) -> Callable:
    return lambda x: fn(x, w, b)


def torch_config(run: Callable[..., list], inputs: list[np.ndarray]) -> Config:
    return Config("pytorch", lambda: run(*inputs), {"runtime": "pytorch", "threads": cpu_count()})


def torch_module_runner(module) -> Callable[..., list]:
    """PyTorch eager for a torch module (the encoder), on every core."""
    import torch

    ensure_threads = _torch_threads()

    def run(*arrays: np.ndarray) -> list:
        ensure_threads()
        with torch.inference_mode():
            out = module(*(torch.from_numpy(a) for a in arrays))
        return [out] if isinstance(out, torch.Tensor) else list(out)
    return run


# ---------------------------------------------------------------------------- one model
def model_and_onnx(name: str, reduced: bool, workdir: Path):
    """(Relax module, ONNX bytes, torch eager runner) for a zoo model, the encoder, or a public
    corpus model named ``corpus:NAME`` (`corpus_models`, its cached export; no torch runner:
    None)."""
    if name.startswith("corpus:"):
        import corpus_models

        path = corpus_models.export(corpus_models.BY_NAME[name.removeprefix("corpus:")])
        return load(path), path.read_bytes(), None
    if name == "encoder":
        from paragraph.models.encoder import encoder_module, export_encoder

        path = export_encoder(workdir / "encoder.onnx", reduced=reduced)
        return load(path), path.read_bytes(), torch_module_runner(encoder_module(reduced))
    mod = models.get(name, reduced=reduced)
    onnx_bytes = to_onnx(mod)
    return mod, onnx_bytes, torch_from_onnx(onnx_bytes)


def profiled_runs(executor, inputs: list[np.ndarray], runs: int,
                  samples: dict[int, list[float]]) -> None:
    """``runs`` profiled runs of ``executor``, each kernel's milliseconds appended to
    ``samples``."""
    for _ in range(runs):
        executor.run(*inputs, profile=True)
        for node, (_, start, end) in executor.timeline.items():
            samples.setdefault(node, []).append((end - start) / 1e6)


def kernel_bound(program: KernelProgram, inputs: list[np.ndarray], runs: int = 10) -> dict:
    """The 1-thread kernel times (median per kernel over ``runs`` profiled sequential runs),
    their sum over the cores and the critical path through them: a bound no schedule of these
    kernels beats."""
    from paragraph.passes.schedule import make_schedule

    executor = make_executor(program, make_schedule("sequential", program.graph, cores=1))
    try:
        samples: dict[int, list[float]] = {}
        # warm-up, not kept: past the vendor kernels' timing of their forms on one thread
        profiled_runs(executor, inputs, SETTLE_RUNS, {})
        profiled_runs(executor, inputs, runs, samples)
    finally:
        executor.close()
    cost = {n: statistics.median(v) for n, v in samples.items()}
    finish: dict[int, float] = {}
    for node in program.graph.nodes:  # nodes are in a topological order
        start = max((finish.get(r.node, 0.0) for r in node.inputs), default=0.0)
        finish[node.id] = start + cost.get(node.id, 0.0)
    total = sum(cost.values())
    critical = max(finish.values(), default=0.0)
    return {"kernels_1thread_ms": total, "critical_path_ms": critical,
            "bound_ms": max(total / cpu_count(), critical)}


def _search_info(plan) -> dict:
    """What a row reports of the search behind ``plan``."""
    report = plan.report.search.to_json()
    return {k: report[k] for k in ("method", "cost", "rules", "seconds", "candidates_built")}


def bench_model(name: str, args, db: CostDB, log) -> dict:
    """All peers and paragraph's schedules on one model, checked, then timed side by side."""
    workdir = Path(tempfile.mkdtemp(prefix="paragraph-peers-"))
    mod, onnx_bytes, torch_run = model_and_onnx(name, args.reduced, workdir)
    inputs = random_inputs(mod, seed=0)
    session = Session("cpu", db=db, log=log)
    built: list = []
    start = time.perf_counter()
    # paragraph's default plan through the one compile path (`paragraph.build`'s), then the
    # other schedules on the program it built
    default = compile(mod, CompileOptions(kernels=args.kernels), session=session,
                      on_built=built.append)
    program = built[0]
    log(f"{name}: {len(program.kernels)} kernels ({program.sources()}) built and planned in "
        f"{time.perf_counter() - start:.0f} s")
    ort = ort_config(onnx_bytes, inputs, parallel=False)
    configs = [ort, ort_config(onnx_bytes, inputs, parallel=True),
               torch_config(torch_run, inputs)]
    vm = vm_config("tvm_vm", program.vm(), inputs, program.device)
    run_vm = vm.run

    def vm_on_all_cores():  # the VM runs on this thread: undo the last executor's pool size
        config_threads(cpu_count())
        return run_vm()
    vm.run = vm_on_all_cores
    vm.info.update(runtime="tvm_vm", kernels=args.kernels)
    configs.append(vm)
    plans = [(f"paragraph:{schedule}", default if schedule == "critical-path" else
              plan_schedule(schedule, program, session))
             for schedule in args.schedules.split(",")]
    same_as: dict[str, str] = {}
    if args.search != "none":  # the graph the substitution search picks, critical-path
        start = time.perf_counter()
        searched = search_plan(from_relax(mod), session, SearchOptions(
            args.search, budget=args.search_budget, top_k=args.top_k), kernels=args.kernels,
            start=dict(plans).get("paragraph:critical-path"))
        assert searched.report.search is not None
        log(f"{name}: {args.search} search {time.perf_counter() - start:.0f} s, "
            f"{len(searched.report.search.rules)} rewrites")
        plans.append((f"paragraph:{args.search}+critical-path", searched))
        # a search that kept its input runs the critical-path row's very program: that row's
        # timing stands for it, so the best row is not the luckier of two timings of one
        # program (ResNet-50 once: 48.4 against 43.6 ms, the same program)
        start_plan = dict(plans).get("paragraph:critical-path")
        if start_plan is not None and searched.program is start_plan.program:
            same_as[plans[-1][0]] = "paragraph:critical-path"
    for config_name, plan in plans:
        if config_name in same_as:
            continue
        c = executor_config(plan.program, plan.schedule, inputs)
        c.name = config_name
        c.info.update(runtime="paragraph", kernels=args.kernels)
        if plan.report.search is not None:
            c.info.update(search=_search_info(plan))
        configs.append(c)
    expected = [np.asarray(a) for a in ort.run()]
    diffs = {}
    for c in configs[1:]:
        got = [np.asarray(a) for a in c.run()]
        diffs[c.name] = max_difference(expected, got)
        if not diffs[c.name] <= TOLERANCE:
            raise RuntimeError(f"{name}: {c.name} differs from ONNX Runtime by "
                               f"{diffs[c.name]:.3g}")
    bound = kernel_bound(program, inputs)
    before = wait_for_quiet_cores(log)
    log(f"{name}: timing {len(configs)} configurations, {args.blocks} blocks of {args.block}")
    settle_and_time_in_blocks(configs, args.blocks, args.block)  # ORT's warm-up too
    after = cpu_contention(2.0)
    ort_ms = statistics.median(ort.samples) * 1e3
    rows = []
    for c in configs:
        row = c.row(None)
        del row["speedup_vs_tvm_vm"]
        row["speed_vs_onnxruntime"] = ort_ms / row["median_ms"]
        row["max_diff_vs_onnxruntime"] = diffs.get(c.name, 0.0)
        rows.append(row)
        log(f"  {c.name:26} {row['median_ms']:9.3f} ms  ({row['speed_vs_onnxruntime']:.2f}x ORT)")
    for label, other in same_as.items():
        rows.append({**next(r for r in rows if r["config"] == other), "config": label,
                     "same_as": other, "search": _search_info(dict(plans)[label])})
        log(f"  {label:26} = {other}")
    ours = [r for r in rows if r["config"].startswith("paragraph:") and "same_as" not in r]
    best = min(ours, key=lambda r: r["median_ms"])
    contended = is_contended(before, after)
    if contended:
        log(f"  FLAGGED: other work held a core around the timing ({before}, {after})")
    target_x = 1.15 if name in BRANCHY else 1.0
    return {"model": name, "reduced": args.reduced, "kernels": args.kernels, "configs": rows,
            "onnxruntime_ms": ort_ms, "paragraph_best": best["config"],
            "paragraph_best_ms": best["median_ms"],
            "paragraph_vs_onnxruntime": best["speed_vs_onnxruntime"],
            "target_vs_onnxruntime": target_x,
            "target_met": best["speed_vs_onnxruntime"] >= target_x, **bound,
            "contention_before": before, "contention_after": after, "contended": contended,
            "load_average": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--kernels", default="vendor", choices=("tvm", "vendor", "auto"),
                        help="paragraph's (and the TVM VM's) kernel source")
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--reduced", action="store_true")
    parser.add_argument("--search", default="none", choices=METHODS,
                        help="also time the graph this substitution search picks")
    parser.add_argument("--search-budget", type=float, default=120.0)
    parser.add_argument("--top-k", type=int, default=4)
    add_results_options(parser)
    args = parser.parse_args()
    out = results_path(args, "peers-cpu")

    def log(msg: str) -> None:
        print(msg, flush=True)

    db = CostDB(Path(tempfile.mkdtemp(prefix="paragraph-peers-")) / "costs.sqlite")
    bench_models(args.models.split(","), lambda m: bench_model(m, args, db, log), out,
                 {"benchmark": "peers", "blocks": args.blocks, "block": args.block,
                  "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                  "gomp_spincount": os.environ.get("GOMP_SPINCOUNT")},
                 merge=args.merge, log=log, order=MODELS)


if __name__ == "__main__":
    main()
