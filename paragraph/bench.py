"""Build, check and time a model under several configurations, side by side.

A configuration is a way to run the same model: ``tvm_compile_default`` (what ``tvm.compile``
gives out of the box; on a CPU its default pipeline does not fuse), ``tvm_vm`` (the TVM VM over
the lowered, fused module the executor runs) and ``executor:<schedule>``. Every configuration's
outputs are checked against the VM's before anything is timed, and timing goes round-robin (one
run of each configuration per round), so that drift on a shared machine hits all alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np
import tvm

from paragraph.errors import ParagraphError
from paragraph.files import atomic_write_json
from paragraph.machine import describe_machine, same_machine
from paragraph.outputs import max_difference
from paragraph.passes.ios import IOSOptions
from paragraph.planner import Plan, Session, plan_schedule
from paragraph.progress import Log
from paragraph.schedule import Schedule
from paragraph.timing import Config, time_in_blocks, time_round_robin
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.frontend.relax_graph import random_inputs
from paragraph.tvm_interop.measure.device import SETTLE_RUNS
from paragraph.tvm_interop.meter.runs import tolerance
from paragraph.tvm_interop.runtime.executor import make_executor
from paragraph.tvm_interop.runtime.program import KernelProgram
from paragraph.tvm_interop.runtime.vm import flatten_result


def vm_config(name: str, vm: tvm.relax.VirtualMachine, inputs: Sequence[np.ndarray],
              device: tvm.runtime.Device) -> Config:
    """A configuration that runs ``vm["main"]`` on device copies of ``inputs``."""
    args = [tvm.runtime.tensor(a, device) for a in inputs]

    def run():
        out = vm["main"](*args)
        device.sync()
        return flatten_result(out)
    return Config(name, run)


def executor_config(program: KernelProgram, schedule: Schedule, inputs: Sequence[np.ndarray],
                    *, use_cuda_graph: bool = True) -> Config:
    """A configuration that runs the parallel executor under ``schedule``."""
    executor = make_executor(program, schedule, use_cuda_graph=use_cuda_graph)
    plan = executor.plan
    info = {"schedule": schedule.name, "streams": schedule.num_streams,
            "threads": list(schedule.threads),
            "waits": sum(map(len, schedule.waits.values())),
            "stages": len(schedule.stages) if schedule.stages else None,
            "peak_bytes": plan.peak_bytes, "no_reuse_bytes": plan.no_reuse_bytes}
    if program.rewrites:  # library rules applied (merged or split convolutions)
        info["rewrites"] = list(program.rewrites)
    on_cpu = program.device.dlpack_device_type() == tvm.cpu().dlpack_device_type()
    name = f"executor:{schedule.name}" + ("" if use_cuda_graph or on_cpu else "+nograph")
    return Config(name, lambda: executor.run(*inputs), info, close=executor.close)


def check_and_time(configs: Sequence[Config], expected: Sequence[np.ndarray], tol: float,
                   repeat: int, progress: Callable[[int], object] | None = None) -> None:
    """`check_outputs`, then `time_round_robin` for ``repeat`` rounds; every configuration is
    closed afterwards, whatever happened."""
    try:
        check_outputs(configs, expected, tol)
        time_round_robin(configs, repeat, progress=progress)
    finally:
        for c in configs:
            if c.close is not None:
                c.close()


def settle_and_time_in_blocks(configs: Sequence[Config], blocks: int, block: int) -> None:
    """Each configuration run `SETTLE_RUNS` times (past its vendor kernels' timing of their
    forms), then all timed in alternating blocks (`time_in_blocks`); every configuration is
    closed afterwards, whatever happened."""
    try:
        for c in configs:
            for _ in range(SETTLE_RUNS):
                c.run()
        time_in_blocks(configs, blocks, block)
    finally:
        for c in configs:
            if c.close is not None:
                c.close()


def check_outputs(configs: Sequence[Config], expected: Sequence[np.ndarray],
                  tol: float = 1e-5) -> None:
    """Raise unless every configuration reproduces ``expected`` within ``tol``
    (`paragraph.planner.max_difference`)."""
    for c in configs:
        worst = max_difference(expected, c.run())
        if not worst <= tol:
            raise ParagraphError(f"{c.name} gives different outputs than the TVM VM "
                                 f"(max relative difference {worst:.3g}, tolerance {tol:g})")


def benchmark(mod: tvm.IRModule, *, schedules: Sequence[str], repeat: int = 20,
              target: object = None, tuning_db: str | None = None, seed: int = 0,
              model: str = "", include_default: bool = True, kernels: str = "tvm",
              ios: IOSOptions | None = None, cores: int | None = None, split: bool = True,
              searched: Plan | None = None, log: Log = print) -> dict:
    """Build every configuration, check its outputs, time them side by side; returns the JSON
    result (per configuration ``config``, ``median_ms``, ``p10_ms``, ``p90_ms``,
    ``speedup_vs_tvm_vm``, ``kernels`` (the kernel source), plus machine, target and
    versions). ``kernels`` ("tvm", "vendor", "auto") is the source of the program's kernels;
    ``tvm_compile_default`` always runs TVM's own. Schedules are names of
    `paragraph.planner.plan_schedule`; IOS ones search with ``ios`` options first and
    report their search time; ``split`` lets critical-path split lone convolutions.
    ``searched``, the `Plan` of a substitution search (`paragraph.planner.search_plan`) of
    the same model, adds ``search:<method>+<schedule>`` with the search's report."""
    log(f"lowering and compiling the kernels ({kernels}) ...")
    start = time.perf_counter()
    program = build_program(mod, target, tuning_db=tuning_db, kernels=kernels)
    sources = ", ".join(f"{n} {s}" for s, n in sorted(program.sources().items()))
    log(f"  {len(program.kernels)} kernels ({sources}), {time.perf_counter() - start:.1f} s")
    inputs = random_inputs(mod, seed)
    vm = vm_config("tvm_vm", program.vm(), inputs, program.device)
    expected = vm.run()
    configs = [vm]
    if include_default:
        log("compiling with tvm.compile's default pipeline ...")
        default = tvm.relax.VirtualMachine(tvm.compile(mod, target=program.target),
                                           program.device)
        configs.append(vm_config("tvm_compile_default", default, inputs, program.device))
    tol = tolerance(program)  # or looser, for a schedule's program with merged or split convs
    with Session(program.target, tuning_db=tuning_db, cores=cores, log=log) as session:
        for name in schedules:
            start = time.perf_counter()
            plan = plan_schedule(name, program, session, ios=ios, split=split)
            log(f"  {plan.schedule.describe()}")
            tol = max(tol, tolerance(plan.program))
            config = executor_config(plan.program, plan.schedule, inputs)
            if plan.report.ios is not None:
                config.info.update(search_s=time.perf_counter() - start,
                                   search=plan.report.ios.summary,
                                   predicted_ms=plan.report.ios.predicted_ms,
                                   program_kernels=len(plan.program.kernels))
            configs.append(config)
    if searched is not None:
        assert searched.report.search is not None  # a substitution search's plan
        report = searched.report.search.to_json()
        tol = max(tol, tolerance(searched.program))
        config = executor_config(searched.program, searched.schedule, inputs)
        config.name = f"search:{report['method']}+{searched.schedule.name}"
        config.info.update(search={k: v for k, v in report.items() if k != "applied"},
                           rewrites=report["applied"],
                           program_kernels=len(searched.program.kernels))
        configs.append(config)
    for c in configs:
        c.info.setdefault("kernels", "tvm" if c.name == "tvm_compile_default" else kernels)
    log(f"checking the outputs of {len(configs)} configurations, then timing {repeat} "
        "rounds ...")
    check_and_time(configs, expected, tol, repeat,
                   progress=lambda r: log(f"  round {r}/{repeat}")
                   if r % max(1, repeat // 4) == 0 else None)
    base = statistics.median(vm.samples) * 1e3
    return {"benchmark": "executor", "model": model, "target": str(program.target),
            "kernels": len(program.kernels), "kernel_sources": program.sources(),
            "repeat": repeat, "machine": describe_machine(),
            "configs": [c.row(base) for c in configs]}


def format_table(result: dict) -> str:
    """The configurations of a `benchmark` result as an aligned text table."""
    lines = [f"{'config':28} {'kernels':>8} {'median ms':>10} {'p10':>9} {'p90':>9} "
             f"{'vs tvm_vm':>9}"]
    for r in result["configs"]:
        speed = r["speedup_vs_tvm_vm"]
        lines.append(f"{r['config']:28} {r.get('kernels', 'tvm'):>8} {r['median_ms']:10.3f} "
                     f"{r['p10_ms']:9.3f} {r['p90_ms']:9.3f} {speed:8.2f}x")
    return "\n".join(lines)


def each_model(names: Sequence[str], bench_one: Callable[[str], dict],
               write: Callable[[list[dict], list[dict]], None],
               log: Log) -> None:
    """Benchmark ``names`` one at a time: ``bench_one(name)`` gives a model's row, which gets
    the date and load average it was taken at, and ``write(rows, failed)`` runs after every
    model, so a long run (or one on a borrowed GPU machine) keeps what it measured. A model
    that fails with `ParagraphError` is logged and recorded in ``failed`` (``{"model",
    "error"}``) and the run goes on; at the end `SystemExit` names the failed models."""
    rows: list[dict] = []
    failed: list[dict] = []
    for name in names:
        try:
            row = bench_one(name)
        except ParagraphError as exc:
            log(f"{name}: FAILED: {exc}")
            failed.append({"model": name, "error": str(exc)})
        else:
            row.update(date=describe_machine()["date"], load_average=os.getloadavg())
            rows.append(row)
        write(rows, failed)
    if failed:
        raise SystemExit(f"{len(failed)} model(s) failed: "
                         f"{', '.join(f['model'] for f in failed)}")


def add_results_options(parser: argparse.ArgumentParser) -> None:
    """The results-file options of a benchmark that writes through `bench_models`: ``--json``
    (see `results_path`) and ``--merge``."""
    parser.add_argument("--json", default=None,
                        help="the results file (default: benchmarks/results/NAME.json)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the models of an existing --json file that this run does "
                             "not time (each model records its own date and load)")


def results_path(args: argparse.Namespace, stem: str) -> str:
    """``--json``, else ``benchmarks/results/<stem>.json`` (``-reduced`` added for reduced
    models)."""
    return args.json or f"benchmarks/results/{stem}{'-reduced' * args.reduced}.json"


def bench_models(names: Sequence[str], bench_one: Callable[[str], dict], out: str,
                 header: dict, *, merge: bool, log: Log,
                 order: Sequence[str] = ()) -> None:
    """`each_model` over ``names``, the results written to ``out`` atomically after each
    model: ``header``, the machine, the load average before and now, the models' rows (with
    ``merge``, an earlier file's rows for models not rerun kept beside them, `kept_models`;
    in the order of ``order`` where given) and the failed ones."""
    kept = kept_models(out, names) if merge else []
    load_before = os.getloadavg()
    rank = {n: i for i, n in enumerate(order)}

    def write(rows: list[dict], failed: list[dict]) -> None:
        models = kept + rows
        if rank:
            models = sorted(models, key=lambda r: rank.get(r["model"], len(rank)))
        atomic_write_json(out, {**header, "machine": describe_machine(),
                                "load_average_before": load_before,
                                "load_average": os.getloadavg(), "models": models,
                                "failed": failed})
        log(f"wrote {out}")

    each_model(names, bench_one, write, log)


def kept_models(path: str | os.PathLike, rerun: Sequence[str]) -> list[dict]:
    """The per-model rows of an earlier benchmark results file (``{"machine": {"date"},
    "load_average", "models": [{"model", ...}]}``) that a run of the models ``rerun`` does
    not time again, each given the date and load average of the run that timed it where it
    lacks its own: a benchmark run with ``--merge`` keeps them beside its own rows."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        old = json.load(f)
    other = same_machine(old["machine"])
    if other is not None:  # one table, one kind of machine
        raise ParagraphError(f"{path} was measured on another machine ({other}): rows from "
                             "both would be compared in one table; rerun every model, or "
                             "write this run to another file")
    return [{"date": old["machine"]["date"], "load_average": old["load_average"], **m}
            for m in old["models"] if m["model"] not in rerun]
