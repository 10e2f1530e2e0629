"""Build, run, export and load: `paragraph.build` -> `ParallelExecutable` -> one file ->
`paragraph.load`.

`build` takes a Relax module (or a model any importer reads) through the one compile path
(`paragraph.planner.compile`: import, optionally the substitution search with the verified rules,
build, plan a schedule) and returns a `ParallelExecutable`: the program, the schedule, the
memory plan the executor uses and the planner's report. ``export_library`` writes all of it as
one file (`paragraph.tvm_interop.runtime.artifact`) that `load` runs in another process with the
same schedule. That file holds native code (the compiled kernels), which `load` loads into
the process: load only files from a trusted source, and give both sides a key
(``export_library(key=...)``, ``load(key=...)`` or ``$PARAGRAPH_ARTIFACT_KEY``) to check that a
file is one you signed; without a key its SHA-256 sums only catch accidental damage. A module
that the `paragraph.transform.InterOperatorSchedule` pass produced
(lowered, with its schedule attached to ``main``) builds under that schedule without planning
again.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm

from paragraph.errors import InputError
from paragraph.inputs import sample_inputs
from paragraph.lean import is_runtime_only
from paragraph.schedule import Schedule
from paragraph.timing import Timing, time_calls
from paragraph.tvm_interop.runtime import artifact as runtime_artifact
from paragraph.tvm_interop.runtime.executor import CPUExecutor, CUDAExecutor, make_executor
from paragraph.tvm_interop.runtime.library import native as native_kernels
from paragraph.tvm_interop.runtime.memory import MemoryPlan, plan_memory
from paragraph.tvm_interop.runtime.program import KernelProgram, compiler_needed

if TYPE_CHECKING:  # the compiler's side: imported where used, so that `load` needs none of it
    from tvm import relax

    from paragraph.passes.ios import IOSOptions
    from paragraph.passes.search import SearchOptions
    from paragraph.planner import Plan, PlanReport
    from paragraph.progress import Log
    from paragraph.tvm_interop.meter.protocol import Meter


class ParallelExecutable:
    """A compiled program under its schedule: run it, time it, export it as one file.

    ``program`` (`KernelProgram`), ``schedule`` (`paragraph.schedule.Schedule`), ``memory``
    (the executor's `MemoryPlan`), ``report`` (what the planner and search measured and
    decided) and ``manifest`` (for a loaded artifact, what its writer recorded). The executor
    (worker threads on a CPU, CUDA streams and a CUDA Graph on a GPU) starts on the first run
    and stops with ``close`` (or at the end of a ``with`` block).

    One executable may be shared by several threads: their runs take turns (each gets its own
    input's outputs), and ``close`` waits for the run in flight; a run after ``close`` starts
    the executor again.
    """

    def __init__(self, program: KernelProgram, schedule: Schedule, *,
                 memory: MemoryPlan | None = None,
                 report: PlanReport | Mapping[str, Any] | None = None,
                 manifest: Mapping[str, Any] | None = None) -> None:
        schedule.validate(program.graph)
        self.program, self.schedule = program, schedule
        self.memory = memory or plan_memory(program.graph, schedule)
        # a planner's `PlanReport` (not imported here: the planner needs TVM's compiler)
        values = report if isinstance(report, Mapping) or report is None else report.to_json()
        self.report: dict[str, Any] = json.loads(json.dumps(dict(values or {}), default=str))
        self.manifest = dict(manifest or {})
        self._executor: CPUExecutor | CUDAExecutor | None = None
        # held for a whole run or timing, so that `close` cannot stop the executor under it
        self._lock = threading.RLock()

    @classmethod
    def of(cls, plan: Plan) -> ParallelExecutable:
        """The executable of a planner's `Plan` (its report as JSON values)."""
        return cls(plan.program, plan.schedule, report=plan.report)

    # -- what it takes and gives
    @property
    def inputs(self) -> list[tuple[str, tuple[int, ...], str]]:
        """(name, shape, dtype) of each input, in order."""
        g = self.program.graph
        return [(g[i].name, g[i].type.shape, g[i].type.dtype) for i in g.inputs]

    @property
    def outputs(self) -> list[tuple[tuple[int, ...], str]]:
        """(shape, dtype) of each output, in order."""
        g = self.program.graph
        return [(g.type_of(r).shape, g.type_of(r).dtype) for r in g.outputs]

    @property
    def rewrites(self) -> tuple[str, ...]:
        """The library rules (by id) that the graph search applied."""
        return self.program.rewrites

    def sample_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Seeded random inputs of the right shapes, valid for what reads them (token ids
        within their embedding table)."""
        g = self.program.graph
        return sample_inputs([g[i].type for i in g.inputs], self.program.input_ranges, seed)

    # -- running
    @property
    def executor(self) -> CPUExecutor | CUDAExecutor:
        """The executor (started on first use)."""
        with self._lock:
            if self._executor is None:
                self._executor = make_executor(self.program, self.schedule, plan=self.memory)
            return self._executor

    def run(self, *inputs: Any) -> list[np.ndarray]:
        """Run once on numpy arrays (or TVM tensors); returns the outputs as numpy arrays.
        Raises `InputError` for a wrong count, shape, dtype or an index out of range."""
        if not inputs and self.inputs:
            raise InputError(f"the model takes {len(self.inputs)} input(s): "
                             + ", ".join(f"{n} {d}{list(s)}" for n, s, d in self.inputs))
        with self._lock:
            return self.executor.run(*inputs)

    def time(self, *inputs: Any, repeat: int = 20, warmup: int = 2) -> Timing:
        """Time ``repeat`` runs (on seeded sample inputs when none are given): median and
        percentiles in `paragraph.timing.Timing`."""
        args = inputs or tuple(self.sample_inputs())
        with self._lock:
            executor = self.executor
            executor.check_inputs(args)
            return time_calls(lambda: executor.run(*args, copy_outputs=False), repeat, warmup)

    def vm(self) -> relax.VirtualMachine:
        """The TVM VM over the same compiled kernels, run one after another (the baseline)."""
        return self.program.vm()

    # -- files
    def export_library(self, path: str | os.PathLike,
                       info: Mapping[str, Any] | None = None, *,
                       key: bytes | None = None) -> Path:
        """Write everything this program needs to run as one file (see
        `paragraph.tvm_interop.runtime.artifact`); `paragraph.load` reads it back. ``info`` (JSON
        values) joins the manifest next to the planner's report. With ``key`` (at least 16
        bytes; default the key file named by ``$PARAGRAPH_ARTIFACT_KEY``, if set) the file is
        signed (HMAC-SHA256), and ``load`` with the same key refuses any other file."""
        _check_compiler("export_library")
        # the compiler's side (the lowered module, the VM's library), slow to import
        from paragraph.tvm_interop.build.artifact import write_artifact

        self._settle_forms()
        return write_artifact(path, self.program, self.schedule, self.memory,
                              {"report": self.report, **(info or {})}, key=key)

    def _settle_forms(self) -> None:
        """Run the program (on sample inputs) until none of its C++ vendor kernels is still
        timing its forms (at most as many runs as their timing takes), so that the artifact
        records a form for each: a kernel bound with a thread count the planner's runs did not
        settle (MobileNetV2's two-thread stream) timed every form again at load, PyTorch's among
        them, and loading libtorch for them cost 105 MiB (`runtime.library.native`)."""
        if not self.program.sources().get("vendor") or native_kernels.loaded() is None:
            return
        args = tuple(self.sample_inputs())
        with self._lock:
            executor = self.executor
            for _ in range(native_kernels.timing_calls() + 1):
                if native_kernels.timing_kernels() == 0:
                    break
                executor.run(*args, copy_outputs=False)

    def close(self) -> None:
        """Stop the executor's threads after the run in flight (a later run starts them
        again)."""
        with self._lock:
            if self._executor is not None:
                self._executor.close()
                self._executor = None

    def __enter__(self) -> ParallelExecutable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(self.program.sources().items()))
        on_cpu = self.program.device.dlpack_device_type() == tvm.cpu().dlpack_device_type()
        where = "cpu" if on_cpu else "cuda"
        return (f"<ParallelExecutable {counts} kernels on {where}, "
                f"{self.schedule.describe()}>")


def build(mod: Any, target: tvm.target.Target | str | None = None, *,
          kernels: str | None = None, schedule: str | None = None,
          search: str | SearchOptions | None = None,
          tuning_db: str | os.PathLike[str] | None = None, cores: int | None = None,
          split: bool = True, ios: IOSOptions | None = None,
          rules: Sequence[Any] | None = None,
          input_shapes: Mapping[str, tuple[int, ...]] | None = None,
          log: Log | None = None, remote: Meter | None = None) -> ParallelExecutable:
    """Compile ``mod`` for ``target`` (this CPU by default) into a `ParallelExecutable`:
    `paragraph.planner.compile` with these options (`paragraph.planner.CompileOptions`).

    ``mod`` is a Relax IRModule, an ONNX file, a torch program or module (anything
    `paragraph.tvm_interop.frontend.importers.load` takes; ``input_shapes`` fixes dynamic
    input dimensions). ``kernels`` is the kernel source (tvm, vendor or auto; default the
    fastest where the program runs); ``schedule`` any of `paragraph.planner.SCHEDULES`
    (default critical-path, which measures kernels, cached); ``search`` a method name (none,
    greedy, taso, autograph) or `SearchOptions` (default: no search); ``rules`` the search's
    rules (default: the shipped verified library). A module lowered by the
    ``InterOperatorSchedule`` pass keeps its schedule. Progress goes to ``log`` (default: the
    ``paragraph`` logger, `paragraph.progress`); ``remote`` measures on a device behind TVM's
    RPC tracker (`paragraph.tvm_interop.meter.remote.Remote`)."""
    _check_compiler("paragraph.build")
    # the compiler's side (the planner, the search, z3's rules): slow to import, and absent
    # where `load` imported TVM's runtime alone (`paragraph.lean`)
    from paragraph.passes.ios import IOSOptions
    from paragraph.passes.search import SearchOptions  # (as above)
    from paragraph.planner import CompileOptions, compile  # (as above)

    options = CompileOptions(target=target, kernels=kernels, schedule=schedule,
                             search=SearchOptions.of(search), tuning_db=tuning_db, cores=cores,
                             split=split, ios=ios or IOSOptions(), rules=rules,
                             input_shapes=input_shapes)
    return ParallelExecutable.of(compile(mod, options, log=log, remote=remote))


def load(path: str | os.PathLike, device: tvm.runtime.Device | None = None, *,
         key: bytes | None = None) -> ParallelExecutable:
    """The `ParallelExecutable` written by ``export_library`` (or ``paragraph compile``),
    checked and linked on ``device`` (the target's default when None).

    **The file contains native code** (its compiled kernels), loaded into this process with
    its rights: load only files from a trusted source. Its SHA-256 sums detect accidental
    damage only, since whoever edits the file can recompute them. With ``key`` (the bytes it
    was exported with; default the key file named by ``$PARAGRAPH_ARTIFACT_KEY``, if set) its
    HMAC-SHA256 signature and every part are checked before anything is written to disk or
    loaded, and an unsigned file, a wrong key or an altered byte is refused. Raises
    `paragraph.tvm_interop.runtime.artifact.ArtifactError` for that, and for a file that is not an
    artifact, is truncated or altered, or was made by another format version, TVM, CPU or
    device.

    Where this process has not imported TVM yet, ``load`` imports its runtime alone, without
    its compiler or PyTorch (`paragraph.lean`; ``PARAGRAPH_LEAN_LOAD=0`` turns that off): the
    program runs the same (``vm`` too), and what needs the compiler (``export_library``,
    ``paragraph.build``) then raises `CompilerNeededError`."""
    if is_runtime_only():
        art = runtime_artifact.read_artifact(path, device, key=key)
    else:
        # the compiler's side of reading (target, lowered module, VM), slow to import
        from paragraph.tvm_interop.build.artifact import read_artifact

        art = read_artifact(path, device, key=key)
    return ParallelExecutable(art.program, art.schedule, memory=art.memory,
                              report=art.manifest.get("info", {}).get("report", {}),
                              manifest=art.manifest)


def _check_compiler(what: str) -> None:
    """Refuse ``what`` in a process whose TVM is its runtime alone (`paragraph.lean`)."""
    if is_runtime_only():
        raise compiler_needed(what)
