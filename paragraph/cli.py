"""The ``paragraph`` command line (tvmc-like verbs): ``models``, ``run``, ``bench``, ``inspect``,
``tune``, ``compile``."""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from paragraph import __version__, models
from paragraph.bench import benchmark, format_table
from paragraph.deploy import ParallelExecutable
from paragraph.deploy import load as load_artifact
from paragraph.errors import ParagraphError, add_note, exit_status
from paragraph.files import atomic_write_bytes, atomic_write_json
from paragraph.graph import Graph
from paragraph.machine import describe_machine
from paragraph.outputs import max_difference
from paragraph.passes.cost import COSTS
from paragraph.passes.ios import IOS_SCHEDULES, MODES, IOSOptions
from paragraph.passes.schedule import ALGORITHMS
from paragraph.passes.search import BUDGET_S, METHODS, SearchOptions
from paragraph.planner import (
    SCHEDULES,
    CompileOptions,
    Plan,
    SearchReport,
    Session,
    check_models,
    compile,
    plan_schedule,
)
from paragraph.rules.cli import register as register_rules
from paragraph.schedule import Schedule
from paragraph.timeline import plot_timeline
from paragraph.timing import time_calls
from paragraph.tvm_interop import from_relax, load, random_inputs, to_relax
from paragraph.tvm_interop.build.tuning_db import RECORDS
from paragraph.tvm_interop.measure.device import settle
from paragraph.tvm_interop.meter.pool import connect
from paragraph.tvm_interop.meter.remote import Remote, parse_address
from paragraph.tvm_interop.meter.runs import tolerance
from paragraph.tvm_interop.runtime.artifact import KEY_ENV, is_artifact, read_key
from paragraph.tvm_interop.runtime.executor import CPUExecutor, gpu_available, make_executor
from paragraph.tvm_interop.runtime.library.names import KERNEL_SOURCES
from paragraph.tvm_interop.runtime.library.torch_kernels import default_kernels
from paragraph.tvm_interop.runtime.program import KernelProgram
from paragraph.tvm_interop.runtime.reference import (
    ROUNDING_FACTOR,
    reference_for,
    reference_rounding,
)
from paragraph.tvm_interop.runtime.target import (
    is_cpu,
    local_cpu_target,
    resolve_target,
)
from paragraph.tvm_interop.runtime.vm import run_vm
from paragraph.tvm_interop.tune.metaschedule import format_summary, tune


def _say(msg: str) -> None:
    print(msg, flush=True)


class _Step:
    """Prints ``what ...`` then ``done (1.2 s)`` around a block: progress for long work."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> _Step:
        print(f"{self.what} ...", end=" ", flush=True)
        self.start = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        took = time.perf_counter() - self.start
        print(f"{'done' if exc_type is None else 'failed'} ({took:.1f} s)", flush=True)
        # the error line says where (`describe`); paragraph's own errors say it already
        if isinstance(exc, Exception) and not isinstance(exc, ParagraphError) and not any(
                n.startswith("while ") for n in getattr(exc, "__notes__", ())):
            add_note(exc, f"while {self.what}")


def parse_shapes(items: Sequence[str] | None) -> dict[str, tuple[int, ...]] | None:
    """``["x:1,3,224,224", ...]`` -> ``{"x": (1, 3, 224, 224)}`` for ``--input-shape``."""
    if not items:
        return None
    shapes = {}
    for item in items:
        name, sep, dims = item.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.replace("x", ",").split(","))
        except ValueError:
            raise ParagraphError(f"--input-shape {item!r}: expected NAME:D1,D2,...") from None
    return shapes


def load_model(name: str, *, reduced: bool = False, batch: int = 1,
               input_shapes: dict[str, tuple[int, ...]] | None = None):
    """A zoo model by name or a model file (``.onnx``) as a Relax module, with a label."""
    if name in models.list():
        return models.get(name, reduced=reduced, batch=batch), (
            f"{name}{' (reduced)' if reduced else ''}, batch {batch}")
    if Path(name).suffix or Path(name).exists():
        if reduced:
            raise ParagraphError("--reduced applies to zoo models only")
        return load(name, input_shapes=input_shapes), name
    raise ParagraphError(f"unknown model {name!r}: give a zoo name "
                         f"({', '.join(models.list())}) or a path to an .onnx file")


def cmd_models(args: argparse.Namespace) -> int:
    rows = [(n, "x".join(map(str, models.input_shape(n))),
             "x".join(map(str, models.input_shape(n, reduced=True))), models.describe(n))
            for n in models.list()]
    head = ("name", "input", "reduced input", "description")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(3)]
    for r in [head] + rows:
        _say("  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3])
    return 0


def _connect(args: argparse.Namespace) -> None:
    """``args.remote``: the device behind ``--rpc-tracker``/``--rpc-key`` (or the older
    ``--rpc HOST:PORT:KEY``); its cores become --threads' default."""
    args.remote = None
    address = _rpc_address(args)
    if address is not None:
        with _Step(f"connecting to {address}"):
            args.remote = connect(address)
        _say(f"  {args.remote.describe()}; kernels and runs are timed there")
        args.threads = args.threads or args.remote.cores


def _rpc_address(args: argparse.Namespace) -> str | None:
    """``HOST:PORT:KEY`` of the options given, or None; `ParagraphError` for half of a pair."""
    tracker, key, old = (getattr(args, n, None) for n in ("rpc_tracker", "rpc_key", "rpc"))
    if old and (tracker or key):
        raise ParagraphError("give --rpc-tracker and --rpc-key, or --rpc HOST:PORT:KEY, not "
                             "both")
    if bool(tracker) != bool(key):
        raise ParagraphError("--rpc-tracker HOST:PORT and --rpc-key KEY go together: the "
                             "tracker, and the key the device registered under")
    return old or (f"{tracker}:{key}" if tracker else None)


def _target(args: argparse.Namespace, here: bool = True) -> Any:
    """The target of --target (cpu: this CPU with --threads cores; cuda: the visible GPU; any
    form `tvm.target.Target` takes), or the remote device's. ``here``: the command runs the
    program on this machine, so a GPU must be visible."""
    remote = getattr(args, "remote", None)
    if remote is not None and args.target == "cpu":  # the default: the device's own target
        return remote.target
    if remote is None and args.target == "cuda" and here and not gpu_available():
        raise ParagraphError("--target cuda: no CUDA GPU is visible to TVM on this machine")
    if args.target == "cpu":
        return local_cpu_target(args.threads)
    return resolve_target(args.target)  # on a remote device: compiled for it as named


def _options(args: argparse.Namespace, target: Any, schedule: str | None = None
             ) -> CompileOptions:
    """The compile options of the command line."""
    return CompileOptions(
        target=target, kernels=args.kernels, schedule=schedule or getattr(args, "schedule", None),
        search=_search_options(args), tuning_db=getattr(args, "tuning_db", None),
        cores=args.threads, split=not getattr(args, "no_split", False),
        ios=_ios_options(args) if hasattr(args, "ios_mode") else IOSOptions())


def _plan(args: argparse.Namespace, mod: Any, step: str,
          on_built: Callable[[KernelProgram], object] | None = None) -> Plan:
    """The model compiled (`paragraph.planner.compile`) as the command line says: --search
    (its candidates built and scheduled), else --kernels (the progress line ``step``) and
    --schedule, or the schedule in --schedule-file (checked against the program's kernel
    graph). ``on_built`` hears of the program before it is planned."""
    options = _options(args, _target(args, here=args.command != "compile"))
    from_file = getattr(args, "schedule_file", None)
    if from_file:  # a program to schedule as the file says: no planning, nothing measured
        options = replace(options, schedule="sequential")
    if options.search is None:
        _say(f"{step}, {options.kernels or 'the fastest'} kernels ...")

    def built(program: KernelProgram) -> None:
        _say(f"  {_kernel_summary(program)} ({program.kernel_source}), built in "
             f"{program.build_seconds:.1f} s")
        if on_built is not None:
            on_built(program)

    plan = compile(mod, options, log=_say, remote=getattr(args, "remote", None),
                   on_built=built)
    if plan.report.search is not None:
        _say_search(plan.report.search)
    return _scheduled_as(from_file, plan.program) if from_file else plan


def _scheduled_as(path: str, program: KernelProgram) -> Plan:
    """``program`` under the schedule saved in ``path`` (--schedule-file), checked against its
    kernel graph."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ParagraphError(f"cannot read {path}: {e.strerror}") from None
    return Plan(program, Schedule.from_json(text, program.graph))


def _search_options(args: argparse.Namespace) -> SearchOptions | None:
    if getattr(args, "search", "none") == "none":
        return None
    return SearchOptions(method=args.search, cost=args.cost or "", beta=args.beta or 0.0,
                         budget=args.search_budget, top_k=args.top_k)


def _say_search(report: SearchReport) -> None:
    _say(f"  {len(report.applied)} rewrites: "
         + ("; ".join(report.applied[:8]) + (" ..." if len(report.applied) > 8 else "")
            if report.applied else "none kept"))
    _say(f"  cost {report.cost_before_ms:.3f} -> {report.cost_after_ms:.3f} ms "
         f"({report.cost}); measured {report.measured_before_ms:.3f} -> "
         f"{report.measured_after_ms:.3f} ms ({report.speedup:.2f}x); "
         f"{report.candidates_built} candidates built in {report.seconds:.0f} s")
    if report.build_failures:
        _say(f"  warning: {len(report.build_failures)} candidates could not be built and "
             f"were skipped (a bug to report; first: {report.build_failures[0]})")


def _ios_options(args: argparse.Namespace):
    warmup, repeat, number = args.ios_protocol
    return IOSOptions(mode=args.ios_mode, r=args.ios_r, s=args.ios_s,
                      max_part_size=args.ios_part_size, max_states=args.ios_max_states,
                      warmup=warmup, repeat=repeat,
                      number=number, budget_s=args.ios_budget, progress=True)


def _protocol(text: str) -> tuple[int, int, int]:
    try:
        warmup, repeat, number = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected WARMUP,REPEAT,NUMBER (three integers), got {text!r}") from None
    if warmup < 0 or repeat < 1 or number < 1:
        raise argparse.ArgumentTypeError(f"need WARMUP >= 0, REPEAT >= 1, NUMBER >= 1: {text!r}")
    return warmup, repeat, number


def _kernel_summary(program: KernelProgram) -> str:
    """``95 vendor + 27 tvm kernels`` for progress lines."""
    counts = program.sources()
    return " + ".join(f"{n} {s}" for s, n in sorted(counts.items())) + " kernels"


def _is_artifact(path: str) -> bool:
    """Whether ``path`` is (or claims to be: a .paragraph file, a zip) a compiled program; a
    damaged one then fails in `paragraph.load` with the reason, not as an unknown model."""
    p = Path(path)
    if is_artifact(p):
        return True
    if not p.is_file():
        return False
    try:
        with p.open("rb") as f:
            return p.suffix == ".paragraph" or f.read(2) == b"PK"
    except OSError:
        return False


def _key(args: argparse.Namespace) -> bytes | None:
    """``--key-file``'s key (None without it: then ``$PARAGRAPH_ARTIFACT_KEY``'s, if set)."""
    return read_key(args.key_file) if getattr(args, "key_file", None) else None


def read_inputs(path: str, graph: Graph) -> list[np.ndarray]:
    """``--inputs FILE``: the inputs of ``graph`` (the model's, or a program's) from a .npz
    file, by input name (``np.savez(f, x=...)``) or in order (``np.savez(f, a, b)``:
    ``arr_0``, ``arr_1``, ...), each checked against the input's shape and dtype;
    `ParagraphError` naming what does not fit."""
    names = [graph[i].name for i in graph.inputs]
    types = [graph[i].type for i in graph.inputs]
    try:
        with np.load(path, allow_pickle=False) as data:
            found = {k: data[k] for k in data.files}
    except (OSError, ValueError) as e:
        raise ParagraphError(f"--inputs {path}: not a readable .npz file ({e})") from None
    positional = [f"arr_{i}" for i in range(len(names))]
    keys = list(names) if set(names) <= set(found) else positional
    missing = [k for k in keys if k not in found]
    if missing or len(found) != len(names):
        raise ParagraphError(f"--inputs {path} holds {sorted(found)}; the model takes "
                             f"{len(names)} input(s): {', '.join(names)} (by name, or in "
                             "order as arr_0, arr_1, ...)")
    out = []
    for key, name, ty in zip(keys, names, types, strict=True):
        a = found[key]
        if tuple(a.shape) != tuple(ty.shape) or np.dtype(a.dtype) != np.dtype(ty.dtype):
            raise ParagraphError(f"--inputs {path}: {key} is {a.dtype}{list(a.shape)}, input "
                                 f"{name!r} takes {ty.dtype}{list(ty.shape)}")
        out.append(a)
    return out


def write_outputs(path: str, outputs: Sequence[np.ndarray]) -> None:
    """``--outputs FILE``: the outputs as a .npz file (``output_0``, ``output_1``, ... as
    tvmc writes them), written atomically."""
    buffer = io.BytesIO()
    arrays: dict[str, Any] = {f"output_{i}": np.asarray(o) for i, o in enumerate(outputs)}
    np.savez(buffer, **arrays)
    atomic_write_bytes(path, buffer.getvalue())
    _say(f"  wrote {len(outputs)} output(s) to {path}")


def _model_inputs(args: argparse.Namespace, mod: tvm.IRModule, graph: Graph
                  ) -> list[np.ndarray]:
    """--inputs (checked against the inputs of ``graph``, the model's), or seeded random
    inputs valid for the model (--seed)."""
    if not getattr(args, "inputs", None):
        return random_inputs(mod, seed=args.seed)
    return read_inputs(args.inputs, graph)


def cmd_run(args: argparse.Namespace) -> int:
    if _is_artifact(args.model):
        return _run_compiled(args)
    _connect(args)
    if args.remote is not None:
        return _run_remote(args)
    with _Step(f"importing {args.model}"):
        mod, label = load_model(args.model, reduced=args.reduced, batch=args.batch,
                                input_shapes=parse_shapes(args.input_shape))
    with _Step("round trip Relax -> paragraph graph -> Relax"):
        graph = from_relax(mod)
        roundtrip = to_relax(graph)
    opaque = sum(n.kind == "opaque" for n in graph.nodes)
    _say(f"  {graph.summary()}")
    _say(f"  {len(graph.operators)} operators, {opaque} opaque; "
         f"hash {graph.structural_hash()[:16]}")
    target = _target(args)
    inputs = _model_inputs(args, mod, graph)
    # the model's outputs from a reference that shares none of the program's kernels (ONNX
    # Runtime for an ONNX file, else the numpy interpreter): the program's own VM runs the
    # same kernels, and would call a wrong one equal
    with _Step("computing the reference outputs"):
        reference = reference_for(args.model, graph)
        expected = reference.outputs(inputs)
    _say(f"  reference: {reference.name}")
    plan = _plan(args, roundtrip, f"lowering and compiling for {target.kind.name} "
                 f"{target.attrs.get('mcpu', target.attrs.get('arch', ''))}")
    _say(f"  schedule {plan.schedule.describe()}")
    if args.save_schedule:
        atomic_write_bytes(args.save_schedule, plan.schedule.dumps().encode())
        _say(f"  wrote {args.save_schedule}")
    return _check_and_time(args, plan, inputs, expected,
                           f"{label}: paragraph executor, {plan.program.kernel_source} kernels",
                           reference.name,
                           lambda: reference_rounding(reference, graph, [(inputs, expected)]))


def _run_remote(args: argparse.Namespace) -> int:
    """``paragraph run MODEL --rpc-tracker HOST:PORT --rpc-key KEY``: compiled here for the
    remote device, scheduled and searched with its measurements, then checked against the TVM
    VM and timed there."""
    remote = args.remote
    if getattr(args, "inputs", None) or getattr(args, "outputs", None):
        raise ParagraphError("--inputs and --outputs run the model here; with an RPC device "
                             "the program runs there on seeded inputs")
    mod, label = load_model(args.model, reduced=args.reduced, batch=args.batch,
                            input_shapes=parse_shapes(args.input_shape))
    plan = _plan(args, mod, f"compiling for {remote.key}")
    _say(f"  schedule {plan.schedule.describe()}")
    device = remote.devices[0]  # the final run on one device of the pool
    with _Step(f"checking and timing on {remote.key}"):
        (seconds,), _ = device.time([(plan.program, plan.schedule)],
                                    blocks=max(1, args.repeat // 5), block=5)
    ok = device.vm_difference <= tolerance(plan.program)
    _say(f"  outputs against the TVM VM there: max difference {device.vm_difference:.3g}: "
         f"{'equal' if ok else 'DIFFERENT'}")
    if not ok:
        _write_json(args, {"equal": False, "max_difference": device.vm_difference})
        return 1
    _say(f"{label} on {device.describe()}: median {seconds * 1e3:.2f} ms, "
         f"{plan.schedule.name} schedule, {plan.program.kernel_source} kernels")
    _write_json(args, {"equal": True, "max_difference": device.vm_difference, "label": label,
                       "median_ms": seconds * 1e3, "remote": remote.describe(),
                       "remote_machine": remote.machine, "kernels": plan.program.sources(),
                       "schedule": plan.schedule.to_json(), "report": plan.report.to_json()})
    return 0


def _check_and_time(args: argparse.Namespace, plan: Plan, inputs: Sequence[np.ndarray],
                    expected: Sequence[np.ndarray], label: str, reference: str,
                    rounding: Callable[[], float | None] | None = None) -> int:
    """Run the plan on the executor, compare with ``expected`` (exit status 1 if they differ
    beyond `paragraph.tvm_interop.meter.runs.tolerance`, or where ``rounding`` (the
    reference's own float32 rounding, measured only then) is given, beyond `ROUNDING_FACTOR`
    times it), write them (--outputs), then time ``--repeat`` runs and print the median."""
    program, schedule = plan.program, plan.schedule
    with _Step("checking the executor's outputs"):
        executor = make_executor(program, schedule, use_cuda_graph=not args.no_cuda_graph)
        got = executor.run(*inputs)
    with executor:
        worst = max((float(np.max(np.abs(a - b))) if a.size and a.shape == b.shape
                     else 0.0 for a, b in zip(expected, got, strict=False)),  # shown only
                    default=0.0)
        difference = max_difference(expected, got)
        allowed = tolerance(program)
        within = ""
        if difference > allowed and rounding is not None and np.isfinite(difference):
            # a deep model can amplify float32 rounding past the tolerance (Inception-v4)
            own = rounding()
            if own is not None:
                allowed = max(allowed, ROUNDING_FACTOR * own)
                within = (f" ({reference} is {own:.2g} from the float64 interpreter: up to "
                          f"{allowed:.2g} is the model's float32 rounding)")
        ok = difference <= allowed
        _say(f"  {len(got)} output(s) against {reference}: max abs difference {worst:.3g}, "
             f"relative to scale {difference:.3g}{within}: "
             f"{'equal' if ok else 'DIFFERENT'}")
        _say(f"  memory: {executor.plan.summary()}")
        if not ok:
            _write_json(args, {"equal": False, "max_difference": difference})
            return 1
        if getattr(args, "outputs", None):
            write_outputs(args.outputs, got)
        # past the vendor kernels' timing of their forms (their first calls): timed within it,
        # a ~1 ms model measured 1.9 ms with p10 1.5
        with _Step(f"timing {args.repeat} runs"):
            settle(lambda: executor.run(*inputs, copy_outputs=False), program.sources())
            timing = time_calls(lambda: executor.run(*inputs, copy_outputs=False), args.repeat,
                                warmup=0)
    _say(f"{label}: median {timing.median_ms:.2f} ms (p10 {timing.percentile_ms(10):.2f}, "
         f"p90 {timing.percentile_ms(90):.2f}) over {args.repeat} runs, {schedule.name} "
         "schedule")
    _write_json(args, {"equal": True, "max_difference": difference, "label": label,
                       "median_ms": timing.median_ms, "p10_ms": timing.percentile_ms(10),
                       "p90_ms": timing.percentile_ms(90), "repeat": args.repeat,
                       "kernels": program.sources(), "rewrites": list(program.rewrites),
                       "schedule": schedule.to_json(), "report": plan.report.to_json()})
    return 0


def _write_json(args: argparse.Namespace, data: Mapping[str, Any]) -> None:
    """--json FILE: the command's result for scripts, with the machine it ran on."""
    if getattr(args, "json", None):
        atomic_write_json(args.json, {"command": args.command, "model": args.model,
                                      **json.loads(json.dumps(dict(data), default=str)),
                                      "machine": describe_machine()})
        _say(f"wrote {args.json}")


def _run_compiled(args: argparse.Namespace) -> int:
    """``paragraph run FILE``: an artifact written by ``paragraph compile``, under its saved
    schedule (or --schedule/--schedule-file), checked against the TVM VM and timed."""
    with _Step(f"loading {args.model}"):
        exe = load_artifact(args.model, key=_key(args))
    program, manifest = exe.program, exe.manifest
    info = manifest.get("info", {})
    _say(f"  {info.get('model', '?')}, {_kernel_summary(program)}, compiled "
         f"{manifest.get('machine', {}).get('date', '?')} with paragraph "
         f"{manifest.get('paragraph')}, TVM {manifest.get('tvm')}")
    if manifest.get("rules"):
        _say(f"  {len(manifest['rules'])} library rewrites: "
             + ", ".join(r["id"] for r in manifest["rules"][:8]))
    check = info.get("report", {}).get("check")
    if check:  # the build's comparison with the original model (not at hand here)
        _say(f"  at build: outputs against {check['reference']} on {len(check['seeds'])} seeded "
             f"input(s): max difference {check['max_difference']}, "
             f"{'equal' if check['equal'] else 'DIFFERENT'}")
    inputs = (read_inputs(args.inputs, program.graph) if getattr(args, "inputs", None)
              else exe.sample_inputs(args.seed))
    with _Step("running the program on the TVM VM"):
        expected = run_vm(program.vm(), inputs, device=program.device)
    if args.schedule_file:
        plan = _scheduled_as(args.schedule_file, program)
    elif args.schedule is not None:
        with Session(program.target, tuning_db=args.tuning_db, cores=args.threads,
                     log=_say) as session:
            plan = plan_schedule(args.schedule, program, session, ios=_ios_options(args),
                                 split=not args.no_split)
    else:
        plan = Plan(program, exe.schedule)
    _say(f"  schedule {plan.schedule.describe()}")
    return _check_and_time(args, plan, inputs, expected,
                           f"{args.model}: {program.kernel_source} kernels",
                           "the TVM VM over the artifact's kernels")


def cmd_compile(args: argparse.Namespace) -> int:
    _connect(args)
    mod, label = load_model(args.model, reduced=args.reduced, batch=args.batch,
                            input_shapes=parse_shapes(args.input_shape))
    plan = _plan(args, mod, f"lowering and compiling {label}")
    _say(f"  schedule {plan.schedule.describe()}")
    exe = ParallelExecutable.of(plan)
    with _Step(f"writing {args.output}"):
        out = exe.export_library(args.output, info={"model": label}, key=_key(args))
    _say(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB): run it with "
         f"`paragraph run {out}`")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    mod, label = load_model(args.model, reduced=args.reduced, batch=args.batch,
                            input_shapes=parse_shapes(args.input_shape))
    address = _rpc_address(args)
    rpc = parse_address(address) if address is not None else None
    # MetaSchedule takes the device through the tracker for the trials; the model check
    # holds a session of its own afterwards (a server serves one session at a time)
    target = Remote.device_target(address) if address is not None else _target(args)
    modules = [(label, mod)]
    if args.search != "none":
        # the graph the search chooses (its candidates measured with the kernels tuned so far)
        # and the original, so tuned baselines stay fair
        args.tuning_db = args.work_dir if (Path(args.work_dir) / RECORDS).exists() else None
        _connect(args)
        try:
            searched = _plan(args, mod, f"searching {label}")
        finally:
            if args.remote is not None:
                args.remote.close()
                args.remote = None
        assert searched.graph is not None
        modules.insert(0, (f"{label} as the {args.search} search rewrote it",
                           to_relax(searched.graph)))
    tuned = {}
    for what, m in modules:
        _say(f"tuning {what} ({args.kernels} kernels)")
        tuned[what] = tune(m, target, args.work_dir, args.trials, kernels=args.kernels,
                           max_tasks=args.max_tasks, log=_say, rpc=rpc)
    # which faster kernels to apply: decided by running every model tuned here end to end
    _connect(args)
    check = check_models([m for _, m in modules], target, args.work_dir, kernels=args.kernels,
                         schedule=args.schedule, cores=args.threads, log=_say,
                         remote=args.remote)
    for what, results in tuned.items():
        for r in results:
            r.applied = r.key in check.kept
        if results:
            _say(f"{what}:\n{format_summary(results)}")
    _say(f"tuning database: {args.work_dir} (use it with --tuning-db {args.work_dir})")
    _write_json(args, {"work_dir": str(args.work_dir), "trials": args.trials,
                       "tuned": {k: [asdict(r) for r in rs] for k, rs in tuned.items()},
                       "model_check": asdict(check)})
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    mod, label = load_model(args.model, reduced=args.reduced, batch=args.batch,
                            input_shapes=parse_shapes(args.input_shape))
    schedules = args.schedules.split(",") if args.schedules else list(ALGORITHMS)
    unknown = [s for s in schedules if s not in SCHEDULES]
    if unknown:
        raise ParagraphError(f"unknown schedule(s) {unknown}; choose from {list(SCHEDULES)}")
    _say(f"benchmarking {label}")
    target = _target(args)
    searched = None
    if args.search != "none":
        searched = _plan(args, mod, f"searching {label}")
    result = benchmark(mod, schedules=schedules, repeat=args.repeat, target=target,
                       tuning_db=args.tuning_db, seed=args.seed, model=args.model, log=_say,
                       kernels=args.kernels or default_kernels(target.kind.name,
                                                               args.tuning_db),
                       ios=_ios_options(args), cores=args.threads,
                       split=not args.no_split, searched=searched)
    result.update(reduced=args.reduced, batch=args.batch)
    _say(format_table(result))
    if args.json:
        atomic_write_json(args.json, result)
        _say(f"wrote {args.json}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    manifest: dict[str, Any] = {}
    searched = None
    if _is_artifact(args.model):  # a compiled program: its manifest, then its timeline
        with _Step(f"loading {args.model}"):
            exe = load_artifact(args.model, key=_key(args))
        manifest = exe.manifest
        label = str(manifest.get("info", {}).get("model", args.model))
        _say(f"  {label}: paragraph {manifest.get('paragraph')}, TVM {manifest.get('tvm')}, "
             f"compiled {manifest.get('machine', {}).get('date', '?')} on "
             f"{manifest.get('machine', {}).get('cpu', '?')}")
        _say(f"  {_kernel_summary(exe.program)}; memory plan {manifest['memory']['blocks']} "
             f"blocks, {manifest['memory']['bytes'] / 2**20:.2f} MiB; "
             f"{len(manifest.get('rules', []))} library rewrites")
        for entry in manifest.get("inputs", []):
            _say(f"  input {entry['name']}: {entry['dtype']}{entry['shape']}")
        program, schedule = exe.program, exe.schedule
        inputs = exe.sample_inputs(args.seed)
    else:
        mod, label = load_model(args.model, reduced=args.reduced, batch=args.batch,
                                input_shapes=parse_shapes(args.input_shape))
        if not is_cpu(_target(args)):
            raise ParagraphError("paragraph inspect records kernel timelines on the CPU "
                                 "executor; use --target cpu")
        plan = _plan(args, mod, f"lowering and compiling {label}")
        searched = plan if plan.graph is not None else None
        program, schedule = plan.program, plan.schedule
        inputs = random_inputs(mod, seed=args.seed)
    _say(f"  schedule {schedule.describe()}")
    if args.dot:
        atomic_write_bytes(args.dot, program.graph.to_dot().encode())
        _say(f"  wrote the kernel graph to {args.dot}")
    if searched is not None and args.graphs and not manifest:
        before, after = (f"{args.graphs}-before.dot", f"{args.graphs}-after.dot")
        atomic_write_bytes(before, from_relax(mod).to_dot().encode())
        if program.operator_graph is not None:
            atomic_write_bytes(after, program.operator_graph.to_dot().encode())
        _say(f"  wrote the operator graph before and after the search to {before}, {after}")
    if args.save_schedule:
        atomic_write_bytes(args.save_schedule, schedule.dumps().encode())
        _say(f"  wrote {args.save_schedule}")
    with CPUExecutor(program, schedule) as executor:
        runs = []
        for _ in range(max(3, args.repeat)):
            executor.run(*inputs, copy_outputs=False, profile=True)
            t = executor.timeline
            runs.append((max(e for _, _, e in t.values()) - min(s for _, s, _ in t.values()),
                         dict(t)))
    span, timeline = sorted(runs, key=lambda r: r[0])[len(runs) // 2]  # the median run
    busy = sum(e - s for _, s, e in timeline.values())
    _say(f"  median run {span / 1e6:.2f} ms, kernels busy {busy / 1e6:.2f} ms "
         f"(average concurrency {busy / max(span, 1):.2f})")
    out = args.out or f"{Path(args.model).stem}-{schedule.name}-timeline.png"
    plot_timeline(timeline, program.graph, out,
                  f"{label}: {schedule.describe()}; {span / 1e6:.2f} ms")
    _say(f"wrote {out}")
    _write_json(args, {"label": label, "schedule": schedule.to_json(),
                       "median_run_ms": span / 1e6, "kernels_busy_ms": busy / 1e6,
                       "concurrency": busy / max(span, 1), "timeline": str(out),
                       "manifest": manifest})
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``paragraph`` command."""
    parser = argparse.ArgumentParser(
        prog="paragraph", description="Graph substitution and inter-operator parallelism "
        "for Apache TVM (Relax).")
    parser.add_argument("--version", action="version", version=f"paragraph {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="on an error, print the full traceback above the one-line message")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("models", help="list the built-in model zoo")
    p.set_defaults(func=cmd_models)

    def model_options(p: argparse.ArgumentParser, tuning_db: bool = True) -> None:
        p.add_argument("model", help="zoo model name (see `paragraph models`), a .onnx file, "
                       "or (run, inspect) a file written by `paragraph compile`, which holds "
                       "native code: run only files from a trusted source")
        p.add_argument("--reduced", action="store_true",
                       help="zoo model at reduced size (same topology, small channels)")
        p.add_argument("--batch", type=_positive, default=1, help="batch size (zoo models)")
        p.add_argument("--input-shape", action="append", metavar="NAME:D1,D2,...",
                       help="static shape for a dynamic model input (repeatable)")
        p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
        p.add_argument("--target", default="cpu", metavar="TARGET",
                       help="what to compile for, as tvm.target.Target takes it: a kind "
                       "(llvm, cuda), a tag (nvidia/nvidia-h100) or the JSON form "
                       "('{\"kind\": \"llvm\", \"mcpu\": \"znver4\"}'); cpu (this CPU) "
                       "and cuda (the visible GPU) are shorthands. Default cpu")
        p.add_argument("--threads", type=_positive, default=None,
                       help="CPU cores to use (default: all this process may use)")
        if tuning_db:
            p.add_argument("--tuning-db", metavar="DIR",
                           help="apply this MetaSchedule database (a `paragraph tune` work dir)")
        p.add_argument("--kernels", choices=KERNEL_SOURCES, default=None,
                       help="kernel source: TVM codegen, vendor libraries through PyTorch "
                       "(oneDNN/cuDNN/cuBLAS), or auto (per kernel the faster of the two, "
                       "measured). Default: the fastest available, vendor where PyTorch is "
                       "installed (auto with --tuning-db), else tvm"
                       + ("" if tuning_db else "; `tune` tunes TVM's kernels: default tvm"))

    def ios_options(p: argparse.ArgumentParser) -> None:
        g = p.add_argument_group("IOS search (--schedule ios)")
        g.add_argument("--ios-mode", choices=MODES, default="both",
                       help="stage kinds: concurrent groups, merged convolutions, or both "
                       "(default both)")
        g.add_argument("--ios-r", type=_positive, default=3,
                       help="at most this many kernels per group (default 3)")
        g.add_argument("--ios-s", type=_positive, default=None,
                       help="at most this many groups per stage (default: 8 on a GPU, as "
                       "in IOS; the core count on a CPU, where more groups share the cores)")
        g.add_argument("--ios-part-size", type=_positive, default=50,
                       help="split blocks larger than this into parts (default 50)")
        g.add_argument("--ios-max-states", type=_positive, default=20000,
                       help="halve parts whose DP has more states than this (default 20000)")
        g.add_argument("--ios-budget", type=float, default=None, metavar="SECONDS",
                       help="search time budget; parts not solved in time run sequentially")
        g.add_argument("--ios-protocol", type=_protocol, default=(2, 6, 6),
                       metavar="W,R,N", help="stage measurement: W warm-ups, R repeats of N "
                       "runs, median (default 2,6,6 as in IOS)")

    def schedule_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--schedule", choices=(*ALGORITHMS, "ios"), default=None,
                       help="how to spread kernels over streams (default critical-path: the "
                       "fastest planner, which times every kernel on its first run and keeps "
                       "the timings in the cost database; opara for a target that can be "
                       "measured neither here nor over RPC; sequential runs one stream on "
                       "every core; ios searches stages by measurement, cached likewise)")
        p.add_argument("--schedule-file", metavar="JSON",
                       help="use a schedule saved with --save-schedule instead")
        p.add_argument("--save-schedule", metavar="JSON", help="write the schedule as JSON")
        split_option(p)
        ios_options(p)

    def split_option(p: argparse.ArgumentParser) -> None:
        p.add_argument("--no-split", action="store_true",
                       help="critical-path: do not split lone convolutions across the streams "
                       "(by default it does where the split program measures faster)")

    def rpc_option(p: argparse.ArgumentParser, what: str = "kernels, IOS's stages, the "
                   "search's kernel signatures and whole runs") -> None:
        g = p.add_argument_group("measuring on another device (TVM RPC)")
        g.add_argument("--rpc-tracker", metavar="HOST:PORT",
                       help="the TVM RPC tracker; with --rpc-key: compile for that device and "
                       f"measure there ({what}). The device runs a server started with "
                       "`python -m paragraph.tvm_interop.meter.remote --tracker HOST:PORT "
                       "--key KEY`")
        g.add_argument("--rpc-key", metavar="KEY",
                       help="the key the device registered under with the tracker")
        g.add_argument("--rpc", metavar="HOST:PORT:KEY",
                       help="the same as --rpc-tracker HOST:PORT --rpc-key KEY")

    def key_option(p: argparse.ArgumentParser, verb: str) -> None:
        p.add_argument("--key-file", metavar="FILE",
                       help=f"{verb} the compiled file with the HMAC-SHA256 key in FILE (its "
                       "bytes, a trailing newline dropped; at least 16: `openssl rand -hex 32 "
                       f"> FILE`); default the key file ${KEY_ENV} names, if set. A compiled "
                       "file holds native code: load only trusted ones. Without a key its "
                       "SHA-256 sums catch accidental damage only; with one, an unsigned, "
                       "foreign or altered file is refused before any of it is loaded")

    def search_options(p: argparse.ArgumentParser) -> None:
        g = p.add_argument_group("substitution search (AutoGraph; TASO/MetaFlow baselines)")
        g.add_argument("--search", choices=METHODS, default="none",
                       help="rewrite the graph with the verified rule library before "
                       "scheduling: greedy (best single rewrite until none helps), taso "
                       "(backtracking per piece, sum cost, beta 1.05 unless --beta), "
                       "autograph (flow partition + DP + backtracking, then candidates built "
                       "and timed on the executor); default none")
        g.add_argument("--cost", choices=COSTS, default=None,
                       help="graph cost the search minimises (default: sum for taso, mixed "
                       "for the others); simulated = the critical-path list schedule's "
                       "makespan on the streams")
        g.add_argument("--beta", "--alpha", type=float, default=None, dest="beta",
                       help="keep candidates within beta of the best (AutoGraph's beta, "
                       "TASO's alpha; default 1.1, 1.05 for taso)")
        g.add_argument("--top-k", type=_non_negative, default=20,
                       help="candidates built and timed per on-board round (default 20); 0: "
                       "no on-board loop, the cheapest graph by the cost is kept unconfirmed, "
                       "as TASO does (fast, and it may run slower than the input)")
        g.add_argument("--search-budget", type=float, default=BUDGET_S, metavar="SECONDS",
                       help="seconds for the whole search, builds included (default "
                       f"{BUDGET_S:g})")

    p = sub.add_parser("run", help="import a model, round-trip it through paragraph's graph, "
                       "compile it, check outputs and time it on the parallel executor (or "
                       "run a file written by `paragraph compile`: native code, so only a "
                       "trusted one)")
    model_options(p)
    key_option(p, "verify")
    schedule_options(p)
    search_options(p)
    p.add_argument("--repeat", type=_positive, default=10, help="timed runs (default 10)")
    p.add_argument("--inputs", metavar="NPZ", help="the model's inputs from a .npz file, by "
                   "input name (or in order: arr_0, arr_1, ...); default seeded random inputs")
    p.add_argument("--outputs", metavar="NPZ", help="write the outputs to a .npz file "
                   "(output_0, output_1, ...)")
    p.add_argument("--json", metavar="FILE", help="write the result (latency, outputs check, "
                   "schedule, planner report, machine) as JSON")
    rpc_option(p)
    p.add_argument("--no-cuda-graph", action="store_true",
                   help="CUDA: issue the streams directly instead of replaying a CUDA Graph")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("bench", help="time the TVM baselines and every schedule side by side")
    model_options(p)
    p.add_argument("--schedules", metavar="A,B",
                   help=f"subset of {','.join((*ALGORITHMS, *IOS_SCHEDULES))} (ios = "
                   f"ios-MODE with --ios-mode; default: all but IOS)")
    p.add_argument("--repeat", type=_positive, default=20, help="timed rounds (default 20)")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    split_option(p)
    ios_options(p)
    search_options(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("inspect", help="profile one schedule and draw its timeline (PNG)")
    model_options(p)
    key_option(p, "verify")
    schedule_options(p)
    p.add_argument("--repeat", type=_positive, default=5, help="profiled runs (median shown)")
    p.add_argument("--out", metavar="PNG", help="timeline file (default MODEL-SCHEDULE-...png)")
    p.add_argument("--dot", metavar="FILE", help="also write the kernel graph as Graphviz dot")
    search_options(p)
    p.add_argument("--graphs", metavar="PREFIX", help="with --search: write the operator graph "
                   "before and after it as PREFIX-before.dot and PREFIX-after.dot")
    p.add_argument("--json", metavar="FILE", help="write the schedule, the median run and (for "
                   "a file from `paragraph compile`) its manifest as JSON")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("tune", help="tune the model's fused kernels with MetaSchedule "
                       "(resumable: run it again to continue)")
    model_options(p, tuning_db=False)
    p.add_argument("--trials", type=_positive, required=True, help="trials per kernel")
    p.add_argument("--work-dir", required=True, metavar="DIR",
                   help="the tuning database (give it to other verbs as --tuning-db)")
    p.add_argument("--max-tasks", type=_positive, default=None,
                   help="tune only the N kernels with the most FLOPs in the model")
    p.add_argument("--schedule", choices=ALGORITHMS, default="critical-path",
                   help="the schedule of the model check: after tuning, the model runs end to "
                   "end with sets of the kernels whose tuned form was faster alone, and the "
                   "fastest set is applied, none unless it beats the untuned model "
                   "(default critical-path, as `run`)")
    search_options(p)
    rpc_option(p, "MetaSchedule's trials, the tuned kernels against the untuned ones, and the "
               "model check")
    p.add_argument("--json", metavar="FILE", help="write each tuned kernel's trials, "
                   "untuned/tuned latency and verdicts, and the model check, as JSON")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("compile", help="compile a model (kernels, weights, schedule, memory "
                       "plan, manifest) into one file that `paragraph run FILE` runs and "
                       "paragraph.load loads; it holds native code, so sign it (--key-file) "
                       "where it travels")
    model_options(p)
    key_option(p, "sign")
    schedule_options(p)
    search_options(p)
    rpc_option(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="the artifact to write (e.g. model.paragraph)")
    p.set_defaults(func=cmd_compile)

    register_rules(sub)
    _debug_after_the_verb(sub)
    return parser


def _debug_after_the_verb(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``--debug`` taken after any verb too (``paragraph run m --debug``); SUPPRESS keeps a
    verb's parser from resetting the flag given before it."""
    for verb in sub.choices.values():
        verb.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                          help=argparse.SUPPRESS)
        for action in verb._actions:
            if isinstance(action, argparse._SubParsersAction):
                _debug_after_the_verb(action)


def _at_least(text: str, low: int) -> int:
    value = int(text)
    if value < low:
        raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
    return value


def _non_negative(text: str) -> int:
    return _at_least(text, 0)


def _positive(text: str) -> int:
    return _at_least(text, 1)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``paragraph`` command; returns the exit status: 0, 2 after any error
    (one line on stderr, ``paragraph: error: ...``; the traceback too with ``--debug``), 130
    after Ctrl+C."""
    args = build_parser().parse_args(argv)

    def command() -> int:
        try:
            if args.command == "tune" and args.kernels is None:  # tuning tunes TVM's kernels
                args.kernels = "tvm"
            return int(args.func(args))
        finally:
            if getattr(args, "remote", None) is not None:  # give the device back
                args.remote.close()

    return exit_status(command, debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
