"""How long libgomp's idle workers should spin: paragraph's default build against ONNX Runtime
at several ``GOMP_SPINCOUNT`` values, idle and with another process holding a core.

``paragraph/__init__.py`` sets ``GOMP_SPINCOUNT`` (PyTorch's libgomp: the vendor kernels'
threads) to 3000 unless the user chose; libgomp reads it once, when it loads, so each setting
needs a process of its own. Per model, one process builds paragraph's default program and
saves it (`paragraph.build`, ``export_library``); then processes at each setting, in an order
that alternates round by round, load that one artifact and time it beside ONNX Runtime's
default session (which keeps its own thread pool, whatever the setting) in alternating blocks.
The figure per process is paragraph's median over ONNX Runtime's: the host's drift between
processes divides out. With ``--busy``, a busy loop holds one core for each process's whole
life, as another tenant would.

    PYTHONPATH=.:benchmarks python benchmarks/spin.py --models mobilenet_v2,resnet18 \
        --spins 3000,300000 --rounds 3 --busy both --json /tmp/spin.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "spin-cpu.json"
SPINS = "3000,30000,300000"
TIMEOUT_S = 900.0


def busy_loop() -> subprocess.Popen:
    """A process that holds one core until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def prepare(name: str, artifact: Path) -> dict:
    """Build paragraph's default program of corpus model ``name`` and save it to ``artifact``."""
    from corpus import onnx_file

    import paragraph

    path = onnx_file(name, artifact.parent)
    start = time.perf_counter()
    exe = paragraph.build(str(path))
    exe.export_library(artifact)
    return {"build_s": round(time.perf_counter() - start, 1), "program": repr(exe)}


def time_one(name: str, artifact: Path, blocks: int, block: int) -> dict:
    """In this process: the artifact loaded and timed beside ONNX Runtime, alternating blocks;
    outputs checked first."""
    import numpy as np
    from corpus import TOLERANCE, onnx_file, relative_error
    from corpus_models import example_inputs
    from peers import ort_config

    import paragraph
    from paragraph.bench import executor_config, settle_and_time_in_blocks
    from paragraph.machine import cpu_contention, is_contended

    path = onnx_file(name, artifact.parent)
    inputs = example_inputs(path, seed=0)
    exe = paragraph.load(artifact)
    ours = executor_config(exe.program, exe.schedule, inputs)
    ours.name = "paragraph"
    ort = ort_config(path.read_bytes(), inputs, parallel=False)
    error = relative_error([np.asarray(a) for a in ort.run()],
                           [np.asarray(a) for a in ours.run()])
    if error > TOLERANCE:
        raise SystemExit(f"{name}: paragraph's outputs differ from ONNX Runtime's ({error:.2g})")
    before = cpu_contention(1.0)
    settle_and_time_in_blocks([ort, ours], blocks, block)
    after = cpu_contention(1.0)
    ms = {c.name: c.row(None)["median_ms"] for c in (ort, ours)}
    return {"onnxruntime_ms": ms["onnxruntime"], "paragraph_ms": ms["paragraph"],
            "ratio": ms["paragraph"] / ms["onnxruntime"], "max_rel_error": error,
            "contention_before": before, "contention_after": after,
            "contended": is_contended(before, after)}


def child(args: list[str], spin: str | None, busy: bool, timeout: float) -> dict:
    """``spin.py args`` in a process of its own with ``GOMP_SPINCOUNT`` at ``spin`` (None:
    unset, libgomp's default), a busy loop on a core beside it where ``busy``; its JSON."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'benchmarks'}")
    env.pop("GOMP_SPINCOUNT", None)
    env.pop("OMP_WAIT_POLICY", None)
    if spin is not None:
        env["GOMP_SPINCOUNT"] = spin
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        loop = busy_loop() if busy else None
        try:
            done = subprocess.run([sys.executable, __file__, *args, "--out", out.name],
                                  env=env, timeout=timeout, capture_output=True, text=True)
        finally:
            if loop is not None:
                loop.kill()
                loop.wait()
        if done.returncode != 0:
            raise RuntimeError(f"spin.py {' '.join(args)} failed ({done.returncode}): "
                               f"{done.stderr.strip()[-2000:]}")
        return json.loads(Path(out.name).read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mobilenet_v2,resnet18,gpt2_6l,googlenet",
                        help="comma-separated corpus rows")
    parser.add_argument("--spins", default=SPINS,
                        help="comma-separated GOMP_SPINCOUNT values ('default': libgomp's)")
    parser.add_argument("--rounds", type=int, default=3, help="processes per setting")
    parser.add_argument("--busy", choices=("no", "yes", "both"), default="both",
                        help="a busy loop on one core beside each process")
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--json", default=str(RESULTS))
    parser.add_argument("--prepare", help=argparse.SUPPRESS)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--artifact", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.prepare or args.one:
        from paragraph.files import atomic_write_json

        artifact = Path(args.artifact)
        row = (prepare(args.prepare, artifact) if args.prepare
               else time_one(args.one, artifact, args.blocks, args.block))
        atomic_write_json(args.out, row)
        return

    from paragraph.bench import bench_models
    from paragraph.machine import forced_isa

    spins = [None if s == "default" else s for s in args.spins.split(",")]
    busy = {"no": [False], "yes": [True], "both": [False, True]}[args.busy]
    workdir = Path(tempfile.mkdtemp(prefix="paragraph-spin-"))

    def one(name: str) -> dict:
        artifact = workdir / f"{name}.so"
        built = child(["--prepare", name, "--artifact", str(artifact)], "3000", False,
                      TIMEOUT_S)
        print(f"{name}: built in {built['build_s']} s: {built['program']}", flush=True)
        runs = []
        for r in range(args.rounds):
            for b in busy:
                order = spins if r % 2 == 0 else spins[::-1]
                for spin in order:
                    got = child(["--one", name, "--artifact", str(artifact), "--blocks",
                                 str(args.blocks), "--block", str(args.block)], spin, b,
                                TIMEOUT_S)
                    runs.append({"round": r, "busy_core": b, "gomp_spincount": spin, **got})
                    print(f"  round {r} busy={b} spin={spin}: paragraph {got['paragraph_ms']:.2f}"
                          f" ms, ONNX Runtime {got['onnxruntime_ms']:.2f} ms "
                          f"({got['ratio']:.3f}x){' CONTENDED' if got['contended'] else ''}",
                          flush=True)
        summary = {}
        for b in busy:
            for spin in spins:
                ratios = [x["ratio"] for x in runs
                          if x["busy_core"] == b and x["gomp_spincount"] == spin]
                summary[f"{'busy' if b else 'idle'}:{spin or 'default'}"] = {
                    "median_ratio": statistics.median(ratios), "ratios": ratios}
        for k, v in summary.items():
            print(f"  {k:16} paragraph/ONNX Runtime median {v['median_ratio']:.3f}", flush=True)
        return {"model": name, "build": built, "runs": runs, "summary": summary}

    bench_models(args.models.split(","), one, args.json, {
        "benchmark": "spin", "isa": forced_isa(), "spins": spins, "rounds": args.rounds,
        "blocks": args.blocks, "block": args.block}, merge=False,
        log=lambda m: print(m, flush=True))


if __name__ == "__main__":
    main()
