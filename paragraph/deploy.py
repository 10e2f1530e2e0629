"""Build, run, export and load: `paragraph.build` -> `ParallelExecutable` -> one file ->
`paragraph.load`.

`build` takes a Relax module (or a model any importer reads), optionally searches its graph with
the verified rules (`paragraph.planner.search_plan`, AutoGraph alg. 1), lowers and compiles its
kernels (`KernelProgram`), plans a schedule (`paragraph.planner.plan_schedule`) and returns a
`ParallelExecutable`: the program, the schedule, the memory plan the executor uses and the
planner's report. ``export_library`` writes all of it as one file
(`paragraph.tvm_interop.build.artifact`) that `load` runs in another process with the same schedule.
A module that the `paragraph.transform.InterOperatorSchedule` pass produced (lowered, with its
schedule attached to ``main``) builds under that schedule without planning again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

from paragraph.errors import InputError
from paragraph.inputs import sample_inputs
from paragraph.passes.search import SearchOptions
from paragraph.planner import Plan, plan_schedule, search_plan
from paragraph.schedule import Schedule
from paragraph.timing import Timing, time_calls
from paragraph.tvm_interop.build.artifact import read_artifact, write_artifact
from paragraph.tvm_interop.build.lowering import resolve_target
from paragraph.tvm_interop.build.program import (
    attached_schedule,
    build_program,
    lowered_info,
    program_from_lowered,
)
from paragraph.tvm_interop.frontend.importers import load as import_model
from paragraph.tvm_interop.frontend.relax_graph import from_relax
from paragraph.tvm_interop.runtime.executor import CPUExecutor, CUDAExecutor, make_executor
from paragraph.tvm_interop.runtime.library.torch_kernels import default_kernels
from paragraph.tvm_interop.runtime.memory import MemoryPlan, plan_memory
from paragraph.tvm_interop.runtime.program import KernelProgram

Log = Callable[[str], None]


class ParallelExecutable:
    """A compiled program under its schedule: run it, time it, export it as one file.

    ``program`` (`KernelProgram`), ``schedule`` (`paragraph.schedule.Schedule`), ``memory``
    (the executor's `MemoryPlan`), ``report`` (what the planner and search measured and
    decided) and ``manifest`` (for a loaded artifact, what its writer recorded). The executor
    (worker threads on a CPU, CUDA streams and a CUDA Graph on a GPU) starts on the first run
    and stops with ``close`` (or at the end of a ``with`` block).
    """

    def __init__(self, program: KernelProgram, schedule: Schedule, *,
                 memory: MemoryPlan | None = None, report: Mapping[str, Any] | None = None,
                 manifest: Mapping[str, Any] | None = None) -> None:
        schedule.validate(program.graph)
        self.program, self.schedule = program, schedule
        self.memory = memory or plan_memory(program.graph, schedule)
        self.report: dict[str, Any] = json.loads(json.dumps(dict(report or {}), default=str))
        self.manifest = dict(manifest or {})
        self._executor: CPUExecutor | CUDAExecutor | None = None

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
        if self._executor is None:
            self._executor = make_executor(self.program, self.schedule, plan=self.memory)
        return self._executor

    def run(self, *inputs: Any) -> list[np.ndarray]:
        """Run once on numpy arrays (or TVM tensors); returns the outputs as numpy arrays.
        Raises `InputError` for a wrong count, shape, dtype or an index out of range."""
        if not inputs and self.inputs:
            raise InputError(f"the model takes {len(self.inputs)} input(s): "
                             + ", ".join(f"{n} {d}{list(s)}" for n, s, d in self.inputs))
        return self.executor.run(*inputs)

    def time(self, *inputs: Any, repeat: int = 20, warmup: int = 2) -> Timing:
        """Time ``repeat`` runs (on seeded sample inputs when none are given): median and
        percentiles in `paragraph.timing.Timing`."""
        args = inputs or tuple(self.sample_inputs())
        executor = self.executor
        executor.check_inputs(args)
        return time_calls(lambda: executor.run(*args, copy_outputs=False), repeat, warmup)

    def vm(self) -> relax.VirtualMachine:
        """The TVM VM over the same compiled kernels, run one after another (the baseline)."""
        return self.program.vm()

    # -- files
    def export_library(self, path: str | os.PathLike,
                       info: Mapping[str, Any] | None = None) -> Path:
        """Write everything this program needs to run as one file (see
        `paragraph.tvm_interop.build.artifact`); `paragraph.load` reads it back. ``info`` (JSON
        values) joins the manifest next to the planner's report."""
        return write_artifact(path, self.program, self.schedule, self.memory,
                              {"report": self.report, **(info or {})})

    def close(self) -> None:
        """Stop the executor's threads (a later run starts them again)."""
        if self._executor is not None:
            self._executor.close()
            self._executor = None

    def __enter__(self) -> ParallelExecutable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(self.program.sources().items()))
        return (f"<ParallelExecutable {counts} kernels on {self.program.target.kind.name}, "
                f"{self.schedule.describe()}>")


def build(mod: Any, target: tvm.target.Target | str | None = None, *,
          kernels: str | None = None, schedule: str = "critical-path", search: str = "none",
          cost: str | None = None, beta: float | None = None, search_budget: float = 120.0,
          top_k: int = 20, tuning_db: str | os.PathLike | None = None,
          cores: int | None = None, split: bool = True, rules: Sequence[Any] | None = None,
          log: Log | None = None) -> ParallelExecutable:
    """Compile ``mod`` for ``target`` (this CPU by default) into a `ParallelExecutable`.

    ``mod`` is a Relax IRModule (or an ONNX file, torch program, anything
    `paragraph.tvm_interop.frontend.importers.load` takes). ``kernels`` is the kernel source
    (tvm, vendor or auto; default the fastest available here, `default_kernels`); ``schedule``
    any of `paragraph.planner.SCHEDULES` (critical-path measures kernels, cached);
    ``search`` one of none, greedy, taso, autograph with its ``cost``, ``beta``,
    ``search_budget`` (seconds), ``top_k`` and ``rules`` (default: the shipped verified
    library). A module lowered by the ``InterOperatorSchedule`` pass keeps its schedule.
    ``log`` receives progress lines."""
    tgt = resolve_target(target)
    tuning = None if tuning_db is None else str(tuning_db)
    if not isinstance(mod, tvm.IRModule):
        mod = import_model(mod)
    if lowered_info(mod) is not None:  # already lowered (and maybe scheduled) by our passes
        program = program_from_lowered(mod, tgt)
        attached = attached_schedule(mod, program)
        if attached is not None:
            return ParallelExecutable(program, attached, report={"schedule": attached.name})
        return _executable(plan_schedule(schedule, program, tuning_db=tuning, cores=cores,
                                         log=log, split=split))
    kernels = kernels or default_kernels(tgt.kind.name, tuning)
    if search != "none":
        options = SearchOptions.of(search, cost, beta, search_budget)
        return _executable(search_plan(from_relax(mod), tgt, options=options,
                                       schedule=schedule, kernels=kernels, tuning_db=tuning,
                                       top_k=top_k, cores=cores, rules=rules, log=log))
    program = build_program(mod, tgt, tuning_db=tuning, kernels=kernels)
    return _executable(plan_schedule(schedule, program, tuning_db=tuning, cores=cores, log=log,
                                     split=split))


def _executable(plan: Plan) -> ParallelExecutable:
    return ParallelExecutable(plan.program, plan.schedule, report=plan.report)


def load(path: str | os.PathLike, device: tvm.runtime.Device | None = None
         ) -> ParallelExecutable:
    """The `ParallelExecutable` written by ``export_library`` (or ``paragraph compile``),
    checked and linked on ``device`` (the target's default when None). Raises
    `paragraph.tvm_interop.build.artifact.ArtifactError` for a file that is not an artifact, is
    truncated or altered, or was made by another format version, TVM, CPU or device."""
    art = read_artifact(path, device)
    return ParallelExecutable(art.program, art.schedule, memory=art.memory,
                              report=art.manifest.get("info", {}).get("report", {}),
                              manifest=art.manifest)
