"""Long run: memory and threads over many runs, loads and builds of one executable (issue 53).

Usage: python benchmarks/longrun.py [--model squeezenet1_1] [--runs 100000] [--loads 1000]
                                    [--builds 1000] [--json benchmarks/results/longrun-cpu.json]

Three phases on the reduced model, in one process: ``--runs`` runs of one
`paragraph.build` executable on 8 seeded inputs in turn (every 1,000th run's outputs checked
against its input's first outputs); ``--loads`` cycles of `paragraph.load` of its artifact, one
run and ``close``; ``--builds`` cycles of `paragraph.build` (the cost database warm, the kernels
compiled again each time), one run and ``close``. The resident memory (VmRSS) and the thread
count are sampled through each phase. A phase leaks when its memory at the end exceeds its
memory after the first tenth by more than ``--leak-mib`` (allocators keep some pages; a leak of
one executable's buffers per cycle shows as megabytes per hundred cycles), or its thread count
grows. Timing is not the point: the load is recorded, not required to be idle.
"""

from __future__ import annotations

import paragraph  # noqa: F401  (first: sets libgomp's spin count before TVM loads torch)

# isort: split
import argparse  # noqa: E402
import gc  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

from paragraph import models  # noqa: E402
from paragraph.files import atomic_write_json  # noqa: E402
from paragraph.machine import describe_machine  # noqa: E402
from paragraph.outputs import max_difference  # noqa: E402

# outputs of a run against its input's first: vendor kernels choose their forms by timing
# their first calls, and another form rounds differently (not bit for bit the same)
TOLERANCE = 1e-4


def _status() -> tuple[float, int]:
    """(resident MiB, threads) of this process, from /proc/self/status."""
    rss, threads = 0.0, 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss, threads


def _phase(name: str, cycles: int, step: Callable[[int], None], samples: int = 20) -> dict:
    """Run ``step(i)`` for i < ``cycles``, sampling memory and threads ``samples`` times."""
    every = max(1, cycles // samples)
    points: list[tuple[int, float, int]] = []
    start = time.monotonic()
    for i in range(cycles):
        step(i)
        if (i + 1) % every == 0 or i + 1 == cycles:
            gc.collect()
            rss, threads = _status()
            points.append((i + 1, round(rss, 1), threads))
            print(f"  {name}: {i + 1}/{cycles}: {rss:.1f} MiB, {threads} threads", flush=True)
    first = next(p for p in points if p[0] >= max(1, cycles // 10))
    last = points[-1]
    return {"cycles": cycles, "seconds": round(time.monotonic() - start, 1),
            "samples": [{"cycle": c, "rss_mib": r, "threads": t} for c, r, t in points],
            "rss_after_first_tenth_mib": first[1], "rss_end_mib": last[1],
            "growth_mib": round(last[1] - first[1], 1),
            "threads_after_first_tenth": first[2], "threads_end": last[2]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="squeezenet1_1")
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--loads", type=int, default=1_000)
    parser.add_argument("--builds", type=int, default=1_000)
    parser.add_argument("--leak-mib", type=float, default=32.0)
    parser.add_argument("--json", default="benchmarks/results/longrun-cpu.json")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    mod = models.get(args.model, reduced=True)
    exe = paragraph.build(mod)
    inputs = [exe.sample_inputs(seed=s) for s in range(8)]
    first = [exe.run(*x)[0].copy() for x in inputs]
    wrong = [0]

    def run(i: int) -> None:
        out = exe.run(*inputs[i % 8])[0]
        if i % 1000 == 0 and not max_difference([first[i % 8]], [out]) <= TOLERANCE:
            wrong[0] += 1

    workdir = Path(tempfile.mkdtemp(prefix="paragraph-longrun-"))
    artifact = exe.export_library(workdir / "model.paragraph")
    phases: dict[str, dict] = {}

    def write() -> list[str]:
        """The results so far, written atomically (a long phase interrupted keeps the others)."""
        leaks = [name for name, p in phases.items()
                 if p["growth_mib"] > args.leak_mib
                 or p["threads_end"] > p["threads_after_first_tenth"]]
        atomic_write_json(args.json, {
            "benchmark": "longrun", "model": f"{args.model} (reduced)",
            "machine": describe_machine(), "load_average_before": load_before,
            "load_average": os.getloadavg(), "leak_threshold_mib": args.leak_mib,
            "phases": phases, "wrong_outputs": wrong[0], "leaks": leaks})
        return leaks

    phases["runs"] = _phase("runs", args.runs, run)
    write()
    exe.close()

    def load(i: int) -> None:
        loaded = paragraph.load(artifact)
        out = loaded.run(*inputs[i % 8])[0]
        if not max_difference([first[i % 8]], [out]) <= TOLERANCE:
            wrong[0] += 1
        loaded.close()

    phases["loads"] = _phase("load/run/close", args.loads, load)
    write()

    def build(i: int) -> None:
        built = paragraph.build(mod, log=lambda _msg: None)
        built.run(*inputs[i % 8])
        built.close()

    phases["builds"] = _phase("build/run/close", args.builds, build)
    leaks = write()
    print(f"wrote {args.json}: wrong outputs {wrong[0]}, leaks {leaks or 'none'}")
    return 1 if leaks or wrong[0] else 0


if __name__ == "__main__":
    sys.exit(main())
