"""ResNeXt-50's grouped convolutions regrouped or split, as TASO and AutoGraph rewrote them on a
GPU (TASO: 32 groups as 8 in every block; AutoGraph fig. 9: 8 and 4 alternately; and the
grouped convolution split into two parallel ones for two streams), timed on this machine.

Usage: python benchmarks/regroup.py [--blocks 10] [--block 10]
           [--json benchmarks/results/regroup-cpu.json]

Each variant applies library rules, by id, to every 32-group convolution of the full-size
model: ``autograph-regroup-4``, 32 -> 8 groups; ``-4`` on even blocks and ``-2`` then ``-4``
on odd ones, 8 and 4 alternately (AutoGraph's); ``-4`` then ``-2``, 32 -> 4;
``autograph-split-groups-2``, two 16-group convolutions on channel halves, concatenated.
Every variant's outputs are checked against the TVM VM; then all are timed side by side in
alternating blocks (vendor kernels): under the sequential schedule on every core and on one
thread, and the split variant under critical-path too (its halves can run on two 1-thread
streams). This is the evidence for why no search rewrites ResNeXt-50 on this CPU (issue 16).
"""

from __future__ import annotations

# first, before TVM loads torch: paragraph sets libgomp's spin count (paragraph/__init__.py)
import paragraph  # noqa: F401

# isort: split
import argparse  # noqa: E402
import dataclasses  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

from paragraph import models  # noqa: E402
from paragraph.bench import (  # noqa: E402
    check_outputs,
    executor_config,
    settle_and_time_in_blocks,
    vm_config,
)
from paragraph.files import atomic_write_json  # noqa: E402
from paragraph.graph import Graph  # noqa: E402
from paragraph.machine import (  # noqa: E402
    cpu_contention,
    describe_machine,
    is_contended,
    wait_for_quiet_cores,
)
from paragraph.passes.schedule import make_schedule  # noqa: E402
from paragraph.planner import Session, plan_schedule  # noqa: E402
from paragraph.rules import default_library  # noqa: E402
from paragraph.tvm_interop import from_relax, random_inputs, to_relax  # noqa: E402
from paragraph.tvm_interop.build.program import build_program  # noqa: E402
from paragraph.tvm_interop.runtime.target import resolve_target  # noqa: E402

MODEL = "resnext50_32x4d"


def rewrite_grouped(graph: Graph, passes: Sequence[tuple[int, Callable[[int], str]]]
                    ) -> tuple[Graph, list[str]]:
    """``graph`` after each pass ``(groups, rule)``: the library rule ``rule(i)`` applied to
    the i-th convolution of ``groups`` groups, in model order, until none is left; the rule ids
    applied, once each."""
    lib = default_library()
    used: list[str] = []
    for groups, rule_for in passes:
        i = 0
        while True:
            conv = next((n for n in graph.nodes
                         if n.kind == "conv2d" and n.attrs.get("groups") == groups), None)
            if conv is None:
                break
            rule_id = rule_for(i)
            rule = lib.get(rule_id)
            match = next(m for m in rule.find(graph) if m.nodes[0] == conv.id)
            rewritten = rule.rewrite(graph, match)
            if rewritten is None:
                raise RuntimeError(f"{rule_id} did not apply to %{conv.id}")
            graph, i = rewritten, i + 1
            used += [rule_id] if rule_id not in used else []
    return graph, used


VARIANTS: dict[str, Sequence[tuple[int, Callable[[int], str]]]] = {
    "32 groups (input)": (),
    "8 groups (TASO's)": ((32, lambda i: "autograph-regroup-4"),),
    # even blocks 32 -> 8; odd ones 32 -> 16 -> 4
    "8 and 4 alternately (AutoGraph's)": ((32, lambda i: "autograph-regroup-2" if i % 2
                                           else "autograph-regroup-4"),
                                          (16, lambda i: "autograph-regroup-4")),
    "4 groups": ((32, lambda i: "autograph-regroup-4"), (8, lambda i: "autograph-regroup-2")),
    "split into two 16-group halves": ((32, lambda i: "autograph-split-groups-2"),),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--block", type=int, default=10, help="timed runs per block")
    parser.add_argument("--reduced", action="store_true")
    parser.add_argument("--json", default=str(Path(__file__).parent / "results"
                                              / "regroup-cpu.json"))
    args = parser.parse_args()
    started = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {msg}", flush=True)

    mod = models.get(MODEL, reduced=args.reduced)
    target = resolve_target("cpu")
    graph = from_relax(mod)
    inputs = random_inputs(mod)
    base = build_program(mod, target, kernels="vendor")
    configs = [vm_config("tvm_vm", base.vm(), inputs, base.device)]
    expected = configs[0].run()
    applied: dict[str, list[str]] = {}
    for variant, passes in VARIANTS.items():
        log(f"building: {variant}")
        rewritten, used = rewrite_grouped(graph, passes)
        applied[variant] = used
        program = build_program(to_relax(rewritten), target, kernels="vendor",
                                      rewrites=tuple(used))
        runs = [("sequential", program, make_schedule("sequential", program.graph)),
                ("sequential, 1 thread", program,
                 make_schedule("sequential", program.graph, cores=1))]
        if "split" in variant:  # the planner may split convolutions: its own program
            plan = plan_schedule("critical-path", program, Session(program.target, log=log))
            runs.append(("critical-path", plan.program, plan.schedule))
        for label, prog, schedule in runs:
            c = executor_config(prog, schedule, inputs)
            configs.append(dataclasses.replace(c, name=f"{variant} / {label}",
                                               info={**c.info, "rewrites": used}))
    before = wait_for_quiet_cores(log)
    check_outputs(configs, expected, 1e-4)
    log("timing")
    settle_and_time_in_blocks(configs, args.blocks, args.block)
    after = cpu_contention(2.0)
    base_ms = statistics.median(configs[0].samples) * 1e3
    rows = [c.row(base_ms) for c in configs]
    for r in rows:
        log(f"  {r['config']:55} {r['median_ms']:8.3f} ms")
    contended = is_contended(before, after)
    result = {"benchmark": "regroup", "model": MODEL, "reduced": args.reduced,
              "kernels": "vendor", "blocks": args.blocks, "block": args.block,
              "machine": describe_machine(), "configs": rows, "rules": applied,
              "contention_before": before, "contention_after": after, "contended": contended}
    if contended:
        log(f"FLAGGED: other work held a core around the timing ({before}, {after})")
    atomic_write_json(args.json, result)
    log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
