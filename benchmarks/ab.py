"""A kernel change measured in one process: the C++ vendor kernels of a base revision against the
working tree's, each bound into an executor of its own, whole runs in alternating blocks.

Usage: python benchmarks/ab.py [--models resnet50,inception_v3] [--threads 2] [--base HEAD]
           [--schedule sequential] [--same-forms] [--blocks 12] [--block 8] [--reduced]
           [--profile CLASS] [--json F]

``--base`` is a git revision (every ``.cc`` and ``.h`` file of its
``paragraph/tvm_interop/runtime/library/cpp/``: ``kernels.cc``, ``aten_forms.cc`` and their headers
(each build with its own ATen library); of a revision from before the headers, its one
``kernels.cc``, or before that
``paragraph/tvm_interop/vendor/native_kernels.cc``), the path of a copy of such a folder, or the
path of a single-file ``kernels.cc``. Both builds load as libraries of their own
(`paragraph.tvm_interop.runtime.library.native.variant`), each with its own chosen forms and packed
weights; the executors run the same program (vendor kernels) under the same schedule, their
outputs are checked against each other, and the timing alternates blocks of runs between them
(the order reversed every block; medians with p10/p90). Why in one process: on the shared
2-core VM, separate processes of the same code differed by up to 10% (BERT 43-52 ms), more than
most kernel changes are worth. With identical sources it is an A/A run: the harness's noise floor.

Each build chooses its forms by timing its own first calls, so a change can also move a choice;
the forms that differ between the two are listed. With ``--same-forms`` the work build takes
the base build's choices (where it has the form), so that only the kernels' code differs. The
machine's contention is recorded before and after, and a model timed while another process held
a core is flagged.

With ``--profile CLASS`` (pooling, concat, product, ...) each kernel of that class is also
profiled in the model in both builds, in alternating blocks, and reported kernel by kernel: a
change worth a few percent of a class is lost in a whole run's noise.
"""

from __future__ import annotations

# first, before TVM loads torch: paragraph sets libgomp's spin count (paragraph/__init__.py)
import paragraph  # noqa: F401

# isort: split
import argparse  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from kernel_classes import kernel_class  # noqa: E402  (benchmarks/ is on the path as a script)
from peers import model_and_onnx, profiled_runs  # noqa: E402

from paragraph.errors import ParagraphError  # noqa: E402
from paragraph.files import atomic_write_json  # noqa: E402
from paragraph.machine import cpu_contention, describe_machine, is_contended  # noqa: E402
from paragraph.outputs import max_difference  # noqa: E402
from paragraph.passes.schedule import make_schedule  # noqa: E402
from paragraph.timing import Config, time_in_blocks  # noqa: E402
from paragraph.tvm_interop import random_inputs  # noqa: E402
from paragraph.tvm_interop.build.program import build_program  # noqa: E402
from paragraph.tvm_interop.measure.device import SETTLE_RUNS  # noqa: E402
from paragraph.tvm_interop.meter.runs import tolerance  # noqa: E402
from paragraph.tvm_interop.runtime.executor import make_executor  # noqa: E402
from paragraph.tvm_interop.runtime.library import native  # noqa: E402
from paragraph.tvm_interop.runtime.target import resolve_target  # noqa: E402

KERNELS = "paragraph/tvm_interop/runtime/library/cpp"  # kernels.cc and its headers
VENDOR = "paragraph/tvm_interop/vendor/native_kernels.cc"  # the one file, before the layout
WARMUP = SETTLE_RUNS  # runs per executor before timing: past every form's timed trials


def git(root: Path, *args: str) -> bytes:
    """git's output (in the checkout ``root``); SystemExit where it fails."""
    done = subprocess.run(["git", *args], cwd=root, capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.decode().strip()}")
    return done.stdout


def base_sources(base: str) -> dict[str, bytes]:
    """The base kernels' files, name -> text (`native.variant` builds them): a folder's (its
    ``.cc`` and ``.h`` files), a single file's (as ``kernels.cc``), or at git revision ``base``
    those of ``KERNELS`` (kernels.cc alone before the headers), else ``VENDOR`` (as
    ``kernels.cc``)."""
    if Path(base).is_dir():
        files = native.sources(Path(base))
        if native.SOURCE.name not in files:
            raise SystemExit(f"--base {base!r}: a folder without {native.SOURCE.name}")
        return files
    if Path(base).is_file():
        return {native.SOURCE.name: Path(base).read_bytes()}
    root = Path(__file__).resolve().parent.parent
    if subprocess.run(["git", "rev-parse", "--verify", "-q", f"{base}^{{commit}}"], cwd=root,
                      capture_output=True).returncode != 0:
        raise SystemExit(f"--base {base!r}: neither a file, a folder nor a git revision")
    files = {}
    for entry in filter(None, git(root, "ls-tree", "-z", base, "--", f"{KERNELS}/").split(b"\0")):
        meta, path = entry.decode().split("\t", 1)  # "<mode> <type> <object>\t<path>"
        name = Path(path).name
        if meta.split()[1] == "blob" and name.endswith(native.SUFFIXES) and name[0] != ".":
            files[name] = git(root, "show", f"{base}:{path}")
    if native.SOURCE.name in files:
        return files
    if subprocess.run(["git", "cat-file", "-e", f"{base}:{VENDOR}"], cwd=root,
                      capture_output=True).returncode == 0:
        return {native.SOURCE.name: git(root, "show", f"{base}:{VENDOR}")}
    raise SystemExit(f"--base {base!r}: a git revision without the kernels ({KERNELS}/ or "
                     f"{VENDOR})")


def chosen(kernels) -> dict[str, str]:
    """The forms a build has chosen so far: key -> index."""
    return dict(str(c).rsplit("=", 1) for c in kernels["paragraph_vendor_chosen_forms"]())


def bench_model(name: str, base, args, log) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        mod, _, _ = model_and_onnx(name, args.reduced, Path(tmp))
    program = build_program(mod, resolve_target("cpu"), kernels="vendor")
    inputs = random_inputs(mod)
    schedule = make_schedule(args.schedule, program.graph, cores=args.threads)
    earlier = {*chosen(base), *chosen(native.module())}  # keys of models before this one
    with native.using(base):
        old = make_executor(program, schedule)
    new = make_executor(program, schedule)
    try:
        for _ in range(WARMUP):
            old.run(*inputs)
        if args.same_forms:  # the work build runs the forms the base chose
            choose = native.module()["paragraph_vendor_choose_form"]
            for key, index in chosen(base).items():
                choose(key, int(index))
        for _ in range(WARMUP):
            new.run(*inputs)
        diff = max_difference(old.run(*inputs), new.run(*inputs))
        if not diff <= tolerance(program):
            raise ParagraphError(f"{name}: the two builds' outputs differ by {diff:.3g}")
        configs = [Config("base", lambda: old.run(*inputs, copy_outputs=False)),
                   Config("work", lambda: new.run(*inputs, copy_outputs=False))]
        before = cpu_contention(1.0)
        for b in range(args.blocks):  # drifts hit both orders
            time_in_blocks(configs if b % 2 == 0 else configs[::-1], 1, args.block, settle=2)
        after = cpu_contention(1.0)
        profile = profile_class(program, old, new, inputs, args.profile, args.blocks, log) \
            if args.profile else None
    finally:
        old.close()
        new.close()
    rows = [c.row(None) for c in configs]
    for r in rows:
        r.pop("speedup_vs_tvm_vm", None)
    ratio = rows[0]["median_ms"] / rows[1]["median_ms"]
    base_forms, work_forms = chosen(base), chosen(native.module())
    moved = {k: [base_forms.get(k), work_forms.get(k)]
             for k in sorted({*base_forms, *work_forms} - earlier)
             if base_forms.get(k) != work_forms.get(k)}
    contended = is_contended(before, after)
    log(f"{name} ({args.threads} thread(s), {args.schedule}): base {rows[0]['median_ms']:.2f} ms, "
        f"work {rows[1]['median_ms']:.2f} ms: work {ratio:.3f}x as fast"
        f"{'  [CONTENDED: another process held a core]' if contended else ''}")
    for key, (b, w) in moved.items():
        log(f"  form chosen differently: {key}: base {b}, work {w}")
    return {"model": name, "reduced": args.reduced, "threads": args.threads,
            "schedule": args.schedule, "configs": rows, "work_speed_vs_base": ratio,
            "same_forms": args.same_forms, "max_diff": diff, "forms_differ": moved,
            "contention_before": before, "contention_after": after, "contended": contended,
            "profile": profile}


def profile_class(program, old, new, inputs, cls: str, blocks: int, log) -> dict:
    """Each kernel of class ``cls`` (`kernel_classes.kernel_class`) in both builds, in the
    model: profiled runs in alternating blocks (five runs each, the order reversed every
    block), per-kernel medians in microseconds. A kernel change that moves a class by a few
    percent is lost in a whole run's noise; here it shows kernel by kernel."""
    samples: dict[str, dict[int, list[float]]] = {"base": {}, "work": {}}  # ms
    pair = [("base", old), ("work", new)]
    for b in range(blocks):
        for label, executor in pair if b % 2 == 0 else pair[::-1]:
            profiled_runs(executor, inputs, 5, samples[label])
    kernels = []
    for node in sorted(samples["base"]):
        func = program.graph[node].attrs.get("func") or program.graph[node].name or ""
        if kernel_class(func) != cls:
            continue
        base_us, work_us = (statistics.median(samples[k][node]) * 1e3 for k in ("base", "work"))
        kernels.append({"node": node, "func": func, "base_us": base_us, "work_us": work_us})
        log(f"  %{node} {func[:60]}: base {base_us:.1f} us, work {work_us:.1f} us")
    totals = {k: sum(r[f"{k}_us"] for r in kernels) for k in ("base", "work")}
    log(f"  {cls}: base {totals['base']:.1f} us, work {totals['work']:.1f} us")
    return {"class": cls, "kernels": kernels, "base_us": totals["base"],
            "work_us": totals["work"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,inception_v3")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--base", default="HEAD", help="git revision or file of the base kernels")
    parser.add_argument("--schedule", default="sequential")
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--block", type=int, default=8, help="timed runs per block")
    parser.add_argument("--same-forms", action="store_true",
                        help="the work build takes the base build's timed form choices")
    parser.add_argument("--reduced", action="store_true")
    parser.add_argument("--profile", metavar="CLASS",
                        help="also each kernel of this class (pooling, concat, product, ...: "
                             "benchmarks/kernel_classes.py), profiled in the model")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    def log(msg: str) -> None:
        print(msg, flush=True)

    files = base_sources(args.base)
    root = Path(__file__).resolve().parent.parent
    if not native.SOURCE.resolve().is_relative_to(root):
        # an editable install of another checkout (a fresh clone's) would make "work" that
        # checkout's kernels: an A/A run of another revision, reported as this tree's
        raise SystemExit(f"paragraph is imported from {native.SOURCE.parents[3]}, not from this "
                         f"checkout ({root}): reinstall it here (pip install --no-deps -e .)")
    work_files = native.sources()
    if native.module() is None:
        raise SystemExit(f"the C++ vendor kernels are unavailable: {native.reason()}")
    if files == work_files:
        log(f"--base {args.base} has the working tree's kernels: an A/A run (the noise floor)")
    log(f"building the base kernels ({args.base}) ...")
    base = native.variant(files)
    load_before = os.getloadavg()
    results = []
    for m in args.models.split(","):
        results.append(bench_model(m, base, args, log))
        if args.json:
            atomic_write_json(args.json, {
                "benchmark": "ab", "base": args.base, "identical_sources": files == work_files,
                "machine": describe_machine(), "blocks": args.blocks, "block": args.block,
                "load_average_before": load_before, "load_average": os.getloadavg(),
                "models": results})
    if args.json:
        log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
