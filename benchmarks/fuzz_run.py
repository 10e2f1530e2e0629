"""One differential fuzzing case: a recipe (`fuzz_graphs`) imported once, compiled by
`paragraph.planner.compile` (the path `paragraph.build` takes) under every kernel source and
search method, planned under every schedule, run on the executor with each of the vendor
kernels' forms forced in turn, and every output compared with the numpy reference of the
original graph; ids out of range must be refused with an `InputError`.

Decisions that measure (critical-path, IOS, the search's on-board loop, the kernel costs it
prices candidates with) take their times from a `DrawnMeter`: seeded random seconds instead of
timings. What the fuzzer checks is that every decision gives a program that computes the model,
so decisions drawn at random reach more of them than this machine's timings would (which on
graphs this small mostly choose alike), and cost nothing. A run with ``--meter local`` times
them for real.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import fuzz_graphs
import fuzz_onnx
import numpy as np
import tvm

from paragraph.deploy import ParallelExecutable
from paragraph.errors import InputError, ParagraphError
from paragraph.inputs import sample_inputs
from paragraph.machine import cpu_count
from paragraph.outputs import max_difference
from paragraph.passes.ios import IOSOptions
from paragraph.passes.search import METHODS, SearchOptions
from paragraph.planner import SCHEDULES, CompileOptions, compile
from paragraph.planner.plan import Plan
from paragraph.planner.schedules import plan_schedule
from paragraph.planner.session import Session
from paragraph.progress import Log
from paragraph.schedule import Schedule
from paragraph.tvm_interop.measure.device import Peaks
from paragraph.tvm_interop.meter.protocol import Groups
from paragraph.tvm_interop.meter.runs import require_equal
from paragraph.tvm_interop.runtime.executor import make_executor
from paragraph.tvm_interop.runtime.library import native
from paragraph.tvm_interop.runtime.program import KernelProgram

# an output's largest difference from the reference, relative to its scale (`max_difference`):
# float32 kernels that sum in another order (oneDNN's, Winograd's, a rewrite's split or merged
# convolutions) differ from numpy's by a few 1e-6 of the scale; 1e-4 leaves room for the
# amplification of a normalisation over a nearly constant row
TOLERANCE = 1e-4
# an output further than TOLERANCE from the float32 reference is still equal when it is within
# CONDITIONED x the distance between two float64 references whose inputs and weights were
# nudged by a float32 rounding: an output made of rounding (a layer norm over values equal
# but for it, seeds 3401 and 4027: no digits to compare) moves that far whatever sums it;
# the kernels sum in a row where numpy sums pairwise, up to n / log n times the rounding
CONDITIONED = 100.0
KERNELS = ("tvm", "vendor", "auto")
SEARCHES = METHODS  # none, greedy, taso, autograph


def _unit(*key: Any) -> float:
    """A number in [0, 1) fixed by ``key``: the same question, the same drawn answer."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0 ** 64


class _DrawnStages:
    """IOS's stage timer of a `DrawnMeter`: seconds drawn per stage."""

    def __init__(self, seed: int, program: KernelProgram) -> None:
        self.seed, self.program = seed, program.graph.structural_hash()

    def measure(self, groups: Groups, strategy: str) -> float:
        kernels = sum(len(g) for g in groups)
        return 1e-5 * (1 + kernels) * (0.5 + _unit(self.seed, self.program, groups, strategy))

    def close(self) -> None:
        """Nothing to free."""


class DrawnMeter:
    """A `paragraph.tvm_interop.meter.protocol.Meter` whose seconds are drawn, fixed by its
    seed and the question (module docstring). ``runs`` with ``check`` runs the candidates
    once and compares their outputs, as the local meter does: the on-board loop's own check
    stays in the path."""

    db = None
    tuning = ""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.cores = cpu_count()

    def kernel_times(self, program: KernelProgram, threads: Sequence[int], *,
                     fill: bool = False, log: Log | None = None) -> list[dict[int, float]]:
        graph = program.graph
        name = graph.structural_hash()
        return [{n.id: 1e-6 + 1e-4 * _unit(self.seed, name, n.id, t) / t
                 for n in graph.nodes if n.kind == "kernel"} for t in threads]

    def measures(self, target: tvm.target.Target) -> bool:
        return True

    def handoff(self, target: tvm.target.Target) -> float:
        return 1e-6 + 2e-5 * _unit(self.seed, "handoff")

    def runs(self, candidates: Sequence[tuple[KernelProgram, Schedule]], *, repeat: int = 6,
             warmup: int = 2, block: int = 5, check: bool = False,
             fresh: bool = False) -> list[float]:
        if check:
            graph = candidates[0][0].graph
            arrays = sample_inputs([graph[i].type for i in graph.inputs],
                                   candidates[0][0].input_ranges)
            outs = []
            for p, s in candidates:
                with make_executor(p, s, use_cuda_graph=False) as ex:
                    outs.append([np.asarray(o) for o in ex.run(*arrays)])
            require_equal(candidates, [max_difference(outs[0], o) for o in outs])
        return [1e-4 * (0.5 + _unit(self.seed, p.graph.structural_hash(), s.describe()))
                for p, s in candidates]

    def stage_timer(self, program: KernelProgram, options: IOSOptions,
                    seq_threads: int) -> _DrawnStages:
        return _DrawnStages(self.seed, program)

    def sequence_seconds(self, program: KernelProgram, threads: int,
                         options: IOSOptions) -> float:
        return 1e-5 * (1 + len(program.graph)) * (0.5 + _unit(self.seed, "seq", threads))

    def peaks(self, target: tvm.target.Target) -> Peaks:
        return Peaks(flops=5e10, bandwidth=1e10)

    def describe(self) -> str:
        return f"drawn times (seed {self.seed})"


@dataclass(frozen=True)
class Combination:
    """How one program of a case is compiled and planned: the kernel source, the search
    method, and the schedules planned on the program it builds."""

    kernels: str
    search: str
    schedules: tuple[str, ...]

    def name(self, schedule: str) -> str:
        return f"{self.kernels}/{self.search}/{schedule}"


def combinations(seed: int, every: bool = False,
                 kernels: Sequence[str] = KERNELS) -> list[Combination]:
    """The combinations a case runs. ``every``: each kernel source with each search method,
    each planning every schedule. Otherwise each search method once (its kernel source
    drawn, ``auto`` one time in twelve, since it times its kernels), the schedules shared
    out between them: every search method and every schedule in each case, their pairs over
    many cases."""
    if every:
        return [Combination(k, s, SCHEDULES) for k in kernels for s in SEARCHES]
    rng = np.random.default_rng([seed & 0xFFFFFFFF, 7])
    plain = [k for k in kernels if k != "auto"] or list(kernels)
    schedules = list(SCHEDULES)
    rng.shuffle(schedules)
    out = []
    for i, s in enumerate(SEARCHES):
        k = "auto" if "auto" in kernels and rng.random() < 0.08 else plain[rng.integers(
            len(plain))]
        out.append(Combination(k, s, tuple(schedules[i::len(SEARCHES)])))
    return out


@dataclass
class Failure:
    """What went wrong in one combination of a case."""

    what: str  # mismatch, error, accepted-out-of-range, references-differ
    where: str  # the combination (kernels/search/schedule, and the form)
    detail: str

    def as_json(self) -> dict[str, str]:
        return {"what": self.what, "where": self.where, "detail": self.detail}


@dataclass
class Outcome:
    """A case's result: the programs run and compared, and the failures."""

    runs: int = 0
    onnx: bool = False  # whether ONNX Runtime checked the reference
    combos: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)


def _quiet(_line: str) -> None:
    """The planner's progress lines, dropped: thousands of cases."""


def run_case(recipe: fuzz_graphs.Recipe, combos: Sequence[Combination], *,
             meter: str = "drawn", forms: bool = True, onnx: bool = True,
             target: str | None = None) -> Outcome:
    """Compile, plan and run ``recipe`` under each of ``combos`` (module docstring); each
    program's outputs compared with the reference, under each vendor form with ``forms``;
    with ``onnx``, the reference first compared with ONNX Runtime's outputs of the recipe
    written as ONNX (`fuzz_onnx`), where it can be. ``target``: where the programs run (None:
    this CPU; "cuda" for the CUDA pass, without forced forms)."""
    out = Outcome()
    try:  # a valid graph the import refuses is a finding too (a GraphError: seed 252)
        mod, graph = fuzz_graphs.imported(recipe)
        arrays = fuzz_graphs.inputs(recipe)
        in_float32 = fuzz_graphs.reference(graph, arrays)
    except Exception as exc:  # noqa: BLE001 (any exception is a finding)
        out.failures.append(Failure("error", "import", _error(exc)))
        return out
    expected = Expected(in_float32, lambda: [fuzz_graphs.reference(graph, arrays, nudge=k)
                                             for k in range(2)])
    if onnx and not recipe.get("special"):  # ONNX Runtime's MaxPool and ReduceMax drop a NaN
        _check_onnxruntime(recipe, arrays, expected, out)
    remote = DrawnMeter(int(recipe["seed"])) if meter == "drawn" else None
    with Session(target, remote=remote, log=_quiet) as session:
        forms = forms and session.on_cpu  # the forced forms are the C++ CPU kernels'
        for combo in combos:
            for schedule, plan in _plans(mod, combo, session, out):
                where = combo.name(schedule)
                out.combos.append(where)
                _check_plan(plan, recipe, arrays, expected, where, forms, out)
    return out


class Expected(list):
    """The float32 reference's outputs, with the same graph computed twice in float64 from
    inputs and weights nudged by a float32 rounding (``nudged``, `fuzz_graphs.reference`):
    how far apart those two are is how much the output amplifies rounding (see
    `CONDITIONED`)."""

    def __init__(self, outputs: list[np.ndarray],
                 nudged: list[list[np.ndarray]] | Callable[[], list[list[np.ndarray]]]) -> None:
        super().__init__(outputs)
        self._nudged = nudged

    @functools.cached_property
    def nudged(self) -> list[list[np.ndarray]] | None:
        """The two nudged references, computed when an output first needs them (one beyond
        the tolerance: most cases never do); None where they cannot be computed, and then no
        output is excused."""
        if not callable(self._nudged):
            return self._nudged
        try:
            return self._nudged()
        except Exception:  # noqa: BLE001 (the strict comparison stands)
            return None

    def difference(self, got: list[np.ndarray]) -> float:
        """`max_difference` from the float32 reference, an output's counted as 0 where it is
        within `CONDITIONED` times the spread of the nudged references (and theirs of the
        float32 one) from them (all agreeing on which values are NaN or infinite)."""
        if len(got) != len(self):
            return max_difference(list(self), got)
        worst = 0.0
        for k, (e, g) in enumerate(zip(self, got, strict=True)):
            diff = max_difference([e], [g])
            if diff <= TOLERANCE or self.nudged is None:
                worst = max(worst, diff)
                continue
            a, b = (n[k] for n in self.nudged)
            if e.shape == a.shape == g.shape:
                rounding = max(max_difference([a], [b]), max_difference([a], [e]))
                if rounding < float("inf") and max_difference([a], [g]) <= max(
                        TOLERANCE, CONDITIONED * rounding):
                    diff = 0.0
            worst = max(worst, diff)
        return worst


def _check_onnxruntime(recipe: fuzz_graphs.Recipe, arrays: list[np.ndarray],
                       expected: Expected, out: Outcome) -> None:
    """The numpy reference against ONNX Runtime's outputs of the same graph (`fuzz_onnx`)."""
    try:
        model = fuzz_onnx.to_onnx(recipe)
        if model is None:
            return
        got = fuzz_onnx.run(model, arrays)
    except Exception as exc:  # noqa: BLE001 (any exception is a finding)
        out.failures.append(Failure("error", "onnxruntime", _error(exc)))
        return
    out.onnx = True
    diff = expected.difference(got)
    if not diff <= TOLERANCE:
        out.failures.append(Failure("references-differ", "onnxruntime",
                                    f"max difference {diff:.3g} of the scale"))


def _plans(mod: tvm.IRModule, combo: Combination, session: Session,
           out: Outcome) -> Iterator[tuple[str, Plan]]:
    """The plans of one combination: compiled once (import, search, build) under its first
    schedule, the same program planned again under the others."""
    first, *rest = combo.schedules
    search = None if combo.search == "none" else SearchOptions(
        method=combo.search, budget=60.0, top_k=2, rounds=2)
    try:
        plan = compile(mod, CompileOptions(kernels=combo.kernels, schedule=first, search=search),
                       session=session)
    except Exception as exc:  # noqa: BLE001 (any exception is a finding)
        out.failures.append(Failure("error", combo.name(first) + " (compile)", _error(exc)))
        return
    yield first, plan
    for schedule in rest:
        try:
            again = plan_schedule(schedule, plan.program, session)
        except Exception as exc:  # noqa: BLE001
            out.failures.append(Failure("error", combo.name(schedule) + " (plan)", _error(exc)))
            continue
        yield schedule, again


def _check_plan(plan: Plan, recipe: fuzz_graphs.Recipe, arrays: list[np.ndarray],
                expected: Expected, where: str, forms: bool, out: Outcome) -> None:
    """Run ``plan`` on a fresh executor (twice: buffers reused) and compare with ``expected``;
    with ``forms``, once per vendor form forced (the kernels' first binding tells how many
    forms there are); then ids out of range, which must raise `InputError`."""
    vendor = forms and any(s != "tvm" for s in plan.program.sources())
    index, count = 0, 1
    while index < count:
        label = f"{where} form {index}" if vendor else where
        try:
            got = _run(plan, arrays, index if vendor else None)
        except Exception as exc:  # noqa: BLE001 (any exception is a finding)
            out.failures.append(Failure("error", label, _error(exc)))
            return
        out.runs += 1
        for run, outputs in enumerate(got):
            diff = expected.difference(outputs)
            if not diff <= TOLERANCE:
                out.failures.append(Failure("mismatch", label + (" (run 2)" if run else ""),
                                            f"max difference {diff:.3g} of the scale"))
                return
        if vendor and index == 0:  # bound now: the most forms of any kernel in the process
            count = native.most_forms()
        index += 1
    for bad in fuzz_graphs.out_of_range(recipe, arrays):
        try:
            _run(plan, bad, None)
        except InputError:
            continue
        except Exception as exc:  # noqa: BLE001
            out.failures.append(Failure("error", where + " (ids out of range)", _error(exc)))
            return
        out.failures.append(Failure("accepted-out-of-range", where,
                                    "ids past the table ran without an InputError"))
        return


def _run(plan: Plan, arrays: Sequence[np.ndarray], form: int | None) -> list[list[np.ndarray]]:
    """Two runs of ``plan`` on a fresh executor (with vendor form ``form`` forced)."""
    with contextlib.ExitStack() as stack:
        if form is not None:
            stack.enter_context(native.forced_form(form))
        ex = stack.enter_context(ParallelExecutable.of(plan))
        return [ex.run(*arrays), ex.run(*arrays)]


def _error(exc: BaseException) -> str:
    """An exception as a report line: its type, message and where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    at = f" at {frames[-1].filename.rsplit('/', 2)[-1]}:{frames[-1].lineno}" if frames else ""
    kind = "ParagraphError " if isinstance(exc, ParagraphError) else ""
    return f"{kind}{type(exc).__name__}: {str(exc)[:500]}{at}"
