"""How the search's measurements scale with the RPC servers of a key (issue 54, item 7).

Usage: python benchmarks/rpc_pool.py [--servers 1,2] [--model squeezenet1_1] [--reduced]
                                     [--candidates 8] [--json FILE]

For each server count, a TVM RPC tracker and that many paragraph servers are started on
loopback, `paragraph.tvm_interop.meter.pool.connect` holds a session on each, and three things
a search does are timed by the wall clock: pricing the model's kernel signatures (each built
here, timed there: `SignatureMeter`), one on-board round (the best graph beside
``--candidates`` candidates, `RemotePool.runs`), and a greedy search of one round
(`search_plan`). On loopback every server shares this machine's cores with the others and with
the client: the figures show the dealing-out overhead and the overlap of building here with
timing there, not what separate devices would give.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from tvm.rpc.tracker import Tracker

from paragraph import models
from paragraph.files import atomic_write_json
from paragraph.machine import cpu_contention, describe_machine
from paragraph.passes.cost import kernels_of
from paragraph.passes.schedule import make_schedule
from paragraph.passes.search import SearchOptions
from paragraph.planner import Session, search_plan
from paragraph.tvm_interop import from_relax
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.measure.costdb import CostDB
from paragraph.tvm_interop.meter.pool import connect, free_servers
from paragraph.tvm_interop.meter.remote import serve
from paragraph.tvm_interop.meter.signatures import SignatureMeter

KEY = "paragraph-pool-bench"


def one_count(servers: int, args: argparse.Namespace) -> dict:
    """The three timings with ``servers`` servers (module docstring)."""
    tracker = Tracker("127.0.0.1", port=9190, port_end=9290, silent=True)
    address = f"127.0.0.1:{tracker.port}"
    procs = [serve(address, KEY, host="127.0.0.1", port=9300, port_end=9400)
             for _ in range(servers)]
    try:
        deadline = time.monotonic() + 60
        while free_servers(f"{address}:{KEY}") < servers and time.monotonic() < deadline:
            time.sleep(0.2)
        with connect(f"{address}:{KEY}", timeout=60) as pool:
            mod = models.get(args.model, reduced=args.reduced)
            graph = from_relax(mod)
            before = cpu_contention(1.0)
            start = time.perf_counter()
            meter = SignatureMeter(pool.target, args.kernels, pool)
            priced = meter.seconds(graph, kernels_of(graph))
            signatures_s = time.perf_counter() - start
            program = build_program(mod, pool.target, kernels=args.kernels)
            seq = make_schedule("sequential", program.graph, cores=pool.cores)
            start = time.perf_counter()
            pool.runs([(program, seq)] * (1 + args.candidates), repeat=3, block=5, check=True)
            round_s = time.perf_counter() - start
            db = CostDB(Path(tempfile.mkdtemp(prefix="paragraph-rpc-pool-")) / "costs.sqlite")
            start = time.perf_counter()
            plan = search_plan(graph, Session(db=db, remote=pool),
                               SearchOptions(method="greedy", budget=args.budget, top_k=4,
                                             rounds=1), kernels=args.kernels)
            search_s = time.perf_counter() - start
            after = cpu_contention(1.0)
            report = plan.report.search
            row = {"servers": pool.parallel, "signatures": len(priced),
                   "signatures_s": signatures_s, "round_candidates": args.candidates,
                   "round_s": round_s, "search_s": search_s,
                   "search_candidates_built": None if report is None
                   else report.candidates_built,
                   "contention_before": before, "contention_after": after}
    finally:
        for p in procs:
            p.terminate()
        tracker.terminate()
    print(f"{servers} server(s): {row['signatures']} signatures in {signatures_s:.1f} s, a "
          f"round of {args.candidates} in {round_s:.1f} s, a greedy search in {search_s:.1f} s",
          flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="1,2")
    parser.add_argument("--model", default="squeezenet1_1")
    parser.add_argument("--reduced", action="store_true")
    parser.add_argument("--kernels", default="vendor", choices=("tvm", "vendor"))
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--json", default="benchmarks/results/rpc-pool-cpu.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = [one_count(int(s), args) for s in args.servers.split(",")]
    base = rows[0]
    for r in rows:
        for k in ("signatures_s", "round_s", "search_s"):
            r[k.replace("_s", "_speedup")] = base[k] / r[k] if r[k] else None
    atomic_write_json(args.json, {
        "benchmark": "rpc_pool", "machine": describe_machine(), "model": args.model,
        "reduced": args.reduced, "kernels": args.kernels, "budget_s": args.budget,
        "note": "loopback: every server shares this machine's cores", "rows": rows,
        "load_average_before": load_before, "load_average": os.getloadavg()})
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
