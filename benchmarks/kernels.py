"""Kernel-source benchmark (issue 6): TVM untuned vs vendor (oneDNN/MKL through PyTorch) vs
MetaSchedule-tuned kernels, each through the TVM VM and the parallel executor's best schedule,
with ONNX Runtime on the same model (exported to ONNX here, batch norm as BatchNormalization so
ORT can fold it) as the reference.

Usage: python benchmarks/kernels.py [--models a,b] [--repeat N] [--untuned-repeat N]
                                    [--tuning-db benchmarks/tuning/cpu] [--reduced]
                                    [--json benchmarks/results/kernels-cpu.json]

Goal: vendor kernels within 1.5x of ONNX Runtime's sequential latency on inception_v3 (the
ratio is in each model's ``vendor_vs_onnxruntime``). Every configuration's outputs are checked
(against its own program's TVM VM, and each program's VM against ONNX Runtime's) before timing,
and configurations of similar speed are timed round-robin; untuned TVM, 10-100x slower, is
timed in its own round with fewer repeats.
"""

from __future__ import annotations

# first, before TVM loads torch: paragraph sets libgomp's spin count (paragraph/__init__.py)
import paragraph  # noqa: F401

# isort: split
import argparse  # noqa: E402
import os
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np
import tvm
from tvm import relax

from paragraph import models
from paragraph.bench import check_outputs, executor_config, vm_config
from paragraph.files import atomic_write_json
from paragraph.machine import cpu_count, describe_machine
from paragraph.outputs import max_difference
from paragraph.passes.schedule import make_schedule
from paragraph.timing import Config, time_round_robin
from paragraph.tvm_interop import random_inputs
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.runtime.program import KernelProgram
from paragraph.tvm_interop.runtime.target import resolve_target
from paragraph.tvm_interop.runtime.threads import config_threads

MODELS = ("inception_v3", "resnet50", "nasnet_a_mobile", "bert")
TUNING_DB = Path(__file__).parent / "tuning" / "cpu"
# (algorithm, max streams, cores): sequential with all cores and with one, the multi-stream
# algorithms, and the same packed onto 2 streams x 1 thread
SCHEDULES = [("sequential", None, None), ("sequential", None, 1), ("opara", None, None),
             ("nimble", None, None), ("wavefront", None, None), ("opara", 2, None),
             ("nimble", 2, None), ("wavefront", 2, None)]
# untuned TVM (seconds per run): one stream with 2 threads, or two with one
UNTUNED_SCHEDULES = [("sequential", None, None), ("opara", 2, None)]
SLOW_S = 0.5  # configurations slower than this per run are timed with --untuned-repeat


# ---------------------------------------------------------------------------- ONNX export
def to_onnx(mod: tvm.IRModule) -> bytes:
    """The zoo module's ``main`` as an ONNX model (opset 20): the operators the zoo uses, with
    weights as initializers. Raises NotImplementedError for anything else."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    func = mod["main"]
    nodes, inits, names = [], [], {}
    counter = iter(range(1 << 30))

    def fresh(prefix: str) -> str:
        return f"{prefix}{next(counter)}"

    def const(arr: np.ndarray) -> str:
        name = fresh("w")
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def arg(expr) -> str:
        if isinstance(expr, relax.Var):
            return names[expr]
        if isinstance(expr, tvm.ir.expr.Constant):
            return const(expr.value.numpy())
        raise NotImplementedError(f"argument {type(expr).__name__}")

    def emit(op: str, inputs: list[str], **attrs) -> str:
        out = fresh("t")
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def ints(v) -> list[int]:
        """Integers of an attribute array, a ShapeExpr or a Tuple of integers."""
        items = v.values if hasattr(v, "values") else v.fields if hasattr(v, "fields") else v
        return [int(getattr(i, "value", i)) for i in items]

    def call(v) -> str | list[str]:
        op, a = v.op.name.removeprefix("relax."), v.attrs
        xs = v.args
        if op == "nn.conv2d":
            assert str(a.data_layout) == "NCHW" and str(a.kernel_layout) == "OIHW"
            return emit("Conv", [arg(xs[0]), arg(xs[1])], strides=ints(a.strides),
                        pads=ints(a.padding), dilations=ints(a.dilation), group=int(a.groups))
        if op == "nn.batch_norm":
            y = emit("BatchNormalization", [arg(x) for x in xs], epsilon=float(a.epsilon))
            return [y, None, None]
        if op in ("nn.max_pool2d", "nn.avg_pool2d"):
            extra = ({"dilations": ints(a.dilation)} if op == "nn.max_pool2d"
                     else {"count_include_pad": int(bool(a.count_include_pad))})
            x, pads, kernel = arg(xs[0]), ints(a.padding), ints(a.pool_size)
            if any(p >= kernel[i % 2] for i, p in enumerate(pads)):
                # ONNX wants pads < kernel. NASNet's 1x1 average pools pad (0, 0, 1, 1) with
                # zeros that count, which only adds zero rows/columns after the sampled ones:
                # pool unpadded, then pad the result (a Pad before the pool, ORT fuses back)
                if op != "nn.avg_pool2d" or kernel != [1, 1] or pads[:2] != [0, 0]:
                    raise NotImplementedError(f"{op} with padding >= kernel")
                n, c, h, w = (int(d) for d in xs[0].ty.shape)
                sh, sw = ints(a.strides)
                y = emit("AveragePool", [x], kernel_shape=kernel, strides=[sh, sw])
                out_h, out_w = (int(d) for d in list(v.ty.shape)[2:])
                extra = [0, 0, 0, 0, 0, 0, out_h - (h - 1) // sh - 1, out_w - (w - 1) // sw - 1]
                return emit("Pad", [y, const(np.array(extra, np.int64))])
            return emit("MaxPool" if op == "nn.max_pool2d" else "AveragePool", [x],
                        kernel_shape=kernel, strides=ints(a.strides), pads=pads,
                        ceil_mode=int(bool(a.ceil_mode)), **extra)
        if op == "nn.adaptive_avg_pool2d":
            assert a.output_size is None or ints(a.output_size) in ([1], [1, 1])
            return emit("GlobalAveragePool", [arg(xs[0])])
        if op == "concat":
            return emit("Concat", [arg(f) for f in xs[0].fields], axis=int(a.axis))
        if op == "reshape":
            return emit("Reshape", [arg(xs[0]), const(np.array(ints(xs[1]), np.int64))])
        if op == "permute_dims":
            return emit("Transpose", [arg(xs[0])], perm=ints(a.axes))
        if op == "strided_slice":
            axes, begin, end = (ints(x) for x in xs[1:4])
            steps = ints(xs[4]) if len(xs) > 4 else [1] * len(axes)
            return emit("Slice", [arg(xs[0])] + [const(np.array(v, np.int64))
                                                 for v in (begin, end, axes, steps)])
        if op == "nn.softmax":
            return emit("Softmax", [arg(xs[0])], axis=int(a.axis))
        if op == "nn.layer_norm":
            assert ints(a.axes) == [-1]
            return emit("LayerNormalization", [arg(x) for x in xs], axis=-1,
                        epsilon=float(a.epsilon))
        simple = {"matmul": "MatMul", "add": "Add", "multiply": "Mul", "subtract": "Sub",
                  "divide": "Div", "nn.relu": "Relu", "nn.gelu": "Gelu", "sigmoid": "Sigmoid",
                  "tanh": "Tanh"}
        if op in simple:
            return emit(simple[op], [arg(x) for x in xs])
        raise NotImplementedError(f"no ONNX export for relax.{op}")

    inputs = []
    for p in func.params:
        names[p] = p.name
        inputs.append(helper.make_tensor_value_info(
            p.name, TensorProto.FLOAT, [int(d) for d in p.ty.shape]))
    for block in func.body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.TupleGetItem):
                names[b.var] = names[v.tuple_value][v.index]
            elif isinstance(v, relax.Var):
                names[b.var] = names[v]
            else:
                names[b.var] = call(v)
    out = names[func.body.body]
    out_shape = [int(d) for d in func.body.body.ty.shape]
    graph = helper.make_graph(nodes, "main", inputs,
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)],
                              ir_version=10)  # what ONNX Runtime 1.31 reads
    onnx.checker.check_model(model)
    return model.SerializeToString()


def ort_config(onnx_bytes: bytes, inputs: list[np.ndarray], threads: int,
               spinning: bool = True) -> Config:
    """ONNX Runtime, sequential executor, all graph optimizations, ``threads`` intra-op; its
    pool threads spin between kernels unless ``spinning`` is off (which, like
    a short OpenMP spin for oneDNN, is faster when the machine is shared)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    session = ort.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(session.get_inputs(), inputs, strict=True)}
    name = "onnxruntime" + ("" if spinning else ":nospin")
    return Config(name, lambda: session.run(None, feed),
                  {"kernels": "onnxruntime", "threads": threads, "spinning": spinning})


# ---------------------------------------------------------------------------- one model
def source_configs(program: KernelProgram, source: str, inputs, log,
                   schedules=SCHEDULES) -> list[Config]:
    """The TVM VM and the executor under ``schedules``, for one kernel source."""
    vm = vm_config(f"{source}:tvm_vm", program.vm(), inputs, program.device)
    vm.info.update(kernels=source)
    run_vm = vm.run

    def with_all_cores():  # the VM runs on this thread: undo the last executor's pool size
        config_threads(cpu_count())
        return run_vm()
    vm.run = with_all_cores
    configs = [vm]
    for name, streams, cores in schedules:
        schedule = make_schedule(name, program.graph, max_streams=streams,
                                 cores=cores or cpu_count())
        c = executor_config(program, schedule, inputs)
        c.name = f"{source}:executor:{schedule.name}" + ("@1thread" if cores == 1 else "")
        c.info.update(kernels=source)
        configs.append(c)
    log(f"  {source}: {program.sources()} kernels, {len(configs)} configurations")
    return configs


def summarize(configs: list[Config], source: str) -> dict:
    rows = {c.name.split(":", 1)[1]: statistics.median(c.samples) * 1e3 for c in configs
            if c.info.get("kernels") == source}
    executors = {k: v for k, v in rows.items() if k.startswith("executor:")}
    best = min(executors, key=executors.get)
    return {"tvm_vm_ms": rows["tvm_vm"], "executor_ms": executors,
            "best_schedule": best.split(":", 1)[1], "best_executor_ms": executors[best]}


def bench_model(name: str, target, *, repeat: int, untuned_repeat: int, tuning_db: Path | None,
                reduced: bool, log, kinds: tuple[str, ...] = ("vendor", "tvm", "tuned")) -> dict:
    log(f"{name}: load average {os.getloadavg()[0]:.1f} (other processes share these cores)")
    mod = models.get(name, reduced=reduced)
    inputs = random_inputs(mod, seed=0)
    threads = cpu_count()
    exported = to_onnx(mod)
    references = [ort_config(exported, inputs, threads, spinning) for spinning in (True, False)]
    references.append(ort_config(exported, inputs, 1, False))
    references[-1].name = "onnxruntime:1thread"
    expected = [np.asarray(a) for a in references[0].run()]
    result = {"model": name, "reduced": reduced}
    fast, slow = list(references), []
    sources = [("vendor", "vendor", None), ("tvm", "tvm", None)]
    if tuning_db is not None:
        sources.append(("tuned", "tvm", tuning_db))
    sources = [s for s in sources if s[0] in kinds]
    for label, kernels, db in sources:
        start = time.perf_counter()
        program = build_program(mod, target, kernels=kernels, tuning_db=db)
        log(f"{name}: {label} kernels built in {time.perf_counter() - start:.0f} s")
        configs = source_configs(program, label, inputs, log,
                                 UNTUNED_SCHEDULES if label == "tvm" else SCHEDULES)
        own = configs[0].run()
        check_outputs(configs, own, 1e-5)
        worst = max(float(np.max(np.abs(a - b))) for a, b in zip(own, expected, strict=True))
        if not max_difference(expected, own) <= 1e-3:  # another runtime: another rounding
            raise RuntimeError(f"{name}/{label}: TVM VM differs from ONNX Runtime by {worst:.3g}")
        result[f"{label}_vs_onnxruntime_max_abs_diff"] = worst
        for c in configs:  # one more run each: which round it belongs in
            start = time.perf_counter()
            c.run()
            (slow if time.perf_counter() - start > SLOW_S else fast).append(c)
    try:
        log(f"{name}: timing {len(fast)} configurations x {repeat} rounds")
        time_round_robin(fast, repeat)
        log(f"{name}: timing {len(slow)} slow configurations x {untuned_repeat} rounds")
        time_round_robin(slow, untuned_repeat, warmup=0, settle=0)  # each ran twice already
    finally:
        for c in fast + slow:
            if c.close is not None:
                c.close()
    ort = {r.name: statistics.median(r.samples) * 1e3 for r in references}
    ort_ms = min(ort.values())  # the reference: the fastest ONNX Runtime configuration
    result["onnxruntime_ms"] = ort_ms
    result["onnxruntime_configs_ms"] = ort
    result["load_average"] = os.getloadavg()
    for label, _, _ in sources:
        result[label] = summarize(fast + slow, label)
    vendor = result.get("vendor")
    if vendor is not None:
        result["vendor_vs_onnxruntime"] = min(vendor["tvm_vm_ms"],
                                              vendor["best_executor_ms"]) / ort_ms
    result["configs"] = [c.row(None) for c in fast + slow]
    log(format_model(result))
    return result


def format_model(r: dict) -> str:
    ort = ", ".join(f"{k} {v:.2f}" for k, v in r["onnxruntime_configs_ms"].items())
    lines = [f"{r['model']}: ONNX Runtime {r['onnxruntime_ms']:.2f} ms ({ort})",
             f"  {'kernels':8} {'TVM VM ms':>10} {'executor ms':>12}  best schedule"]
    for label in ("tvm", "vendor", "tuned"):
        if label in r:
            s = r[label]
            lines.append(f"  {label:8} {s['tvm_vm_ms']:10.2f} {s['best_executor_ms']:12.2f}  "
                         f"{s['best_schedule']}")
    if "vendor_vs_onnxruntime" in r:
        lines.append(f"  vendor / ONNX Runtime: {r['vendor_vs_onnxruntime']:.2f}x (goal <= 1.5x "
                     "on inception_v3)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--untuned-repeat", type=int, default=2)
    parser.add_argument("--tuning-db", default=str(TUNING_DB),
                        help="MetaSchedule database for the tuned configuration ('' for none)")
    parser.add_argument("--reduced", action="store_true")
    parser.add_argument("--sources", default="vendor,tvm,tuned",
                        help="kernel sources to time (untuned tvm takes seconds to minutes "
                        "per run at full size)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    kinds = tuple(args.sources.split(","))
    target = resolve_target("cpu")
    db = Path(args.tuning_db) if args.tuning_db else None
    if db is not None and not (db / "database_tuning_record.json").exists():
        print(f"no tuning database in {db}: skipping the tuned configuration", flush=True)
        db = None
    out = args.json or ("benchmarks/results/kernels-cpu"
                        f"{'-reduced' if args.reduced else ''}.json")
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    results = [bench_model(m, target, repeat=args.repeat, untuned_repeat=args.untuned_repeat,
                           tuning_db=db, reduced=args.reduced, log=log, kinds=kinds)
               for m in args.models.split(",")]
    atomic_write_json(out, {"benchmark": "kernels", "target": str(target),
                            "machine": describe_machine(), "repeat": args.repeat,
                            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                            "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
                            "untuned_repeat": args.untuned_repeat, "sources": list(kinds),
                            "tuning_db": str(db) if db else None,
                            "goal": "vendor within 1.5x of ONNX Runtime on inception_v3",
                            "models": results})
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
