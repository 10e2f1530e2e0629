"""Memory a deployment pays (issue 52 item 7): peak resident memory of a process that builds,
of one that loads and runs, and the artifact's size, against ONNX Runtime, on the corpus.

Usage::

    python benchmarks/memory.py [--models a,b] [--kinds mobile,...] [--runs 5]
                                [--json benchmarks/results/memory-cpu.json] [--merge]

Per model (its ONNX export from `corpus_models`, as `corpus.py` uses), each step in a fresh
process of its own, its peak resident memory read from ``/proc/self/status`` (``VmHWM``):

* ``onnxruntime``: import onnxruntime, open the default CPU session, ``--runs`` runs;
* ``paragraph_build``: ``paragraph.build(model.onnx)`` with its defaults and a fresh cost
  database, then ``export_library`` (the artifact the next steps load);
* ``paragraph_load``: ``paragraph.load(artifact)`` and ``--runs`` runs: what a server pays
  (TVM's runtime alone, `paragraph.lean`);
* ``paragraph_load_full``: the same with ``PARAGRAPH_LEAN_LOAD=0`` (TVM whole, with its
  compiler and PyTorch), as every load was before 2026-12-01;
* ``paragraph_build_own`` and ``paragraph_load_own``: build and load again with
  ``PARAGRAPH_TORCH_FORMS=0`` (no kernel with an own form times PyTorch's, so the load needs
  no libtorch wherever own forms exist);
* ``imports``: the baselines, ``import onnxruntime``, ``import paragraph``, ``import tvm``
  and TVM's runtime alone.

The inputs are made once, in this process, and read from a file by the steps (making them
imports onnx, 30 MiB that neither side needs).

Each step also says whether it mapped libtorch_cpu, and a load its runs' median milliseconds
(one process each and not refused under load: not a speed figure, which is `corpus.py`'s).
Sizes: the ONNX file, the model's weights (the initializers' bytes), the artifact and each of
its members. Timing is not the point: a row records the load average but is not refused for
it. Written atomically after each model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path

import corpus  # noqa: E402  (benchmarks/ on the path)
import corpus_models  # noqa: E402
import numpy as np

from paragraph.files import atomic_write_json
from paragraph.machine import describe_machine

# the high-water mark of this process's own memory map: not ``ru_maxrss``, which Linux carries
# across exec from the forked parent (every step then read at least the parent's size)
_PEAK = ("import json\n"
         "def _peak():\n"
         "    for line in open('/proc/self/status'):\n"
         "        if line.startswith('VmHWM:'):\n"
         "            return int(line.split()[1]) / 1024\n"
         "def _torch():\n"
         "    return 'libtorch_cpu' in open('/proc/self/maps').read()\n"
         "_ms = []\n")

STEPS = {
    "import_onnxruntime": "import onnxruntime\n",
    "import_paragraph": "import paragraph\n",
    "import_tvm": "import tvm\n",
    "import_tvm_runtime": "import paragraph.lean\nparagraph.lean.runtime_only_tvm()\n",
    "onnxruntime": textwrap.dedent("""
        import numpy as np, onnxruntime as ort
        s = ort.InferenceSession(ONNX, providers=["CPUExecutionProvider"])
        x = np.load(INPUTS)
        feed = dict(zip([i.name for i in s.get_inputs()], [x[k] for k in sorted(x.files)]))
        for _ in range(RUNS):
            start = time.perf_counter()
            s.run(None, feed)
            _ms.append((time.perf_counter() - start) * 1e3)
        """),
    "paragraph_build": textwrap.dedent("""
        import paragraph
        exe = paragraph.build(ONNX)
        exe.export_library(ARTIFACT)
        """),
    # a server's process: TVM's runtime alone (`paragraph.lean`), unless LEAN is "0"
    "paragraph_load": textwrap.dedent("""
        import numpy as np, paragraph
        exe = paragraph.load(ARTIFACT)
        x = np.load(INPUTS)
        x = [x[k] for k in sorted(x.files)]
        for _ in range(RUNS):
            start = time.perf_counter()
            exe.run(*x)
            _ms.append((time.perf_counter() - start) * 1e3)
        """),
}
# the load step again with TVM imported whole (its compiler, and PyTorch through TVM FFI)
FULL = {"paragraph_load_full": "paragraph_load"}
# the build and load steps again with PyTorch's forms untimed (PARAGRAPH_TORCH_FORMS=0), on
# an artifact of their own
OWN = {"paragraph_build_own": "paragraph_build", "paragraph_load_own": "paragraph_load"}
STEP_OF = {**FULL, **OWN}

def step(name: str, onnx: Path, artifact: Path, runs: int, cache: Path, timeout: float
         ) -> dict:
    """Run step ``name`` in a fresh process; its peak MiB and seconds (or its error)."""
    inputs = artifact.with_suffix(".inputs.npz") if artifact.name else artifact
    if name in OWN:
        artifact = artifact.with_suffix(".own.paragraph")
    code = ("import time\n" + _PEAK
            + f"ONNX, ARTIFACT, INPUTS, RUNS = {str(onnx)!r}, {str(artifact)!r}, "
            f"{str(inputs)!r}, {runs}\n" + STEPS[STEP_OF.get(name, name)]
            + "print(json.dumps({'peak_mib': round(_peak(), 1), 'libtorch': _torch(), "
            "'run_ms': round(sorted(_ms)[len(_ms) // 2], 2) if _ms else None}))\n")
    env = {**os.environ, "PARAGRAPH_CACHE_DIR": str(cache),
           "PARAGRAPH_LEAN_LOAD": "0" if name in FULL else "1",
           "PARAGRAPH_TORCH_FORMS": "0" if name in OWN else "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                          os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    seconds = round(time.monotonic() - start, 1)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {out.returncode}: {tail[:300]}", "seconds": seconds}
    return {**json.loads(lines[-1]), "seconds": seconds}


def weights_bytes(onnx: Path) -> int:
    """The bytes of the model's initializers (its weights)."""
    import onnx as onnx_pkg  # the onnx extra: only this benchmark's sizes need it

    model = onnx_pkg.load(str(onnx), load_external_data=False)
    return sum(len(t.raw_data) or 0 for t in model.graph.initializer)


def bench_model(name: str, args: argparse.Namespace, workdir: Path) -> dict:
    onnx = corpus.onnx_file(name, workdir)
    artifact = workdir / f"{name}.paragraph"
    cache = corpus_cache(workdir / f"cache-{name}")
    row: dict = {"model": name, "kind": corpus.describe(name)[0],
                 "date": time.strftime("%Y-%m-%d"), "load_average": os.getloadavg(),
                 "onnx_mb": round(onnx.stat().st_size / 2**20, 2),
                 "weights_mb": round(weights_bytes(onnx) / 2**20, 2)}
    # the inputs made here, once: a step that made them would import onnx (30 MiB) first
    np.savez(artifact.with_suffix(".inputs.npz"), *corpus_models.example_inputs(onnx))
    for s in ("onnxruntime", "paragraph_build", "paragraph_load", "paragraph_load_full",
              "paragraph_build_own", "paragraph_load_own"):
        made = artifact.with_suffix(".own.paragraph") if s in OWN else artifact
        if s.startswith("paragraph_load") and not made.exists():
            row[s] = {"error": "no artifact: the build failed"}
            continue
        row[s] = step(s, onnx, artifact, args.runs, cache, args.timeout)
        print(f"  {name} {s}: {row[s]}", flush=True)
    if artifact.exists():
        with zipfile.ZipFile(artifact) as z:
            row["artifact_members_mb"] = {i.filename: round(i.file_size / 2**20, 2)
                                          for i in z.infolist()}
        row["artifact_mb"] = round(artifact.stat().st_size / 2**20, 2)
        row["artifact_vs_weights"] = round(row["artifact_mb"] / max(row["weights_mb"], 1e-6), 2)
    ort, load = row["onnxruntime"].get("peak_mib"), row["paragraph_load"].get("peak_mib")
    if ort and load:
        row["load_vs_onnxruntime"] = round(load / ort, 2)
    full = row["paragraph_load_full"].get("peak_mib")
    if ort and full:
        row["load_full_vs_onnxruntime"] = round(full / ort, 2)
    own = row["paragraph_load_own"].get("peak_mib")
    if ort and own:
        row["load_own_vs_onnxruntime"] = round(own / ort, 2)
    return row


_BUILD_NATIVE = ("from paragraph.tvm_interop.runtime import native\n"
                 "from paragraph.tvm_interop.runtime.library import native as kernels\n"
                 "native.runner()\n"
                 "kernels.module()\n")


def corpus_cache(path: Path) -> Path:
    """A fresh cache directory holding this machine's native libraries (built once)."""
    native = Path(os.environ.get("PARAGRAPH_CACHE_DIR") or Path.home() / ".cache" / "paragraph")
    (path / "native").mkdir(parents=True, exist_ok=True)
    for lib in (native / "native").glob("*.so"):
        target = path / "native" / lib.name
        if not target.exists():
            target.symlink_to(lib)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="")
    parser.add_argument("--kinds", default="")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", default="benchmarks/results/memory-cpu.json")
    parser.add_argument("--merge", action="store_true",
                        help="keep the file's other rows, replace those run now")
    args = parser.parse_args(argv)
    names = corpus.select(args.models, args.kinds)
    # the native libraries built into this machine's cache first: each model's fresh cache
    # links them (`corpus_cache`), and a library built inside one model's cache was built
    # again in every other model's build step (70 s of its seconds)
    subprocess.run([sys.executable, "-c", _BUILD_NATIVE], check=True)
    workdir = Path(tempfile.mkdtemp(prefix="paragraph-memory-"))
    cache = corpus_cache(workdir / "cache-imports")
    result = {"benchmark": "memory", "runs": args.runs, "machine": describe_machine(),
              "versions": corpus.versions(), "load_average_before": os.getloadavg(),
              "imports": {s: step(s, Path(), Path(), 0, cache, args.timeout)
                          for s in ("import_onnxruntime", "import_paragraph", "import_tvm",
                                    "import_tvm_runtime")},
              "models": []}
    print(f"imports: {result['imports']}", flush=True)
    if args.merge and Path(args.json).exists():
        old = json.loads(Path(args.json).read_text())
        result["models"] = [r for r in old.get("models", []) if r["model"] not in names]
    for name in names:
        result["models"].append(bench_model(name, args, workdir))
        result["load_average"] = os.getloadavg()
        atomic_write_json(args.json, result)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
