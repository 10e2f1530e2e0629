"""What a kernel costs after other work, against called back to back (findings, eleventh round).

Usage: python benchmarks/neighbours.py [--threads 2] [--calls 30] [--rounds 3] [--json F]

Each case is one C++ vendor kernel bound directly (`native.bind`, no executor) and timed, one
call at a time, right after a prep step: nothing (the kernel again: its back-to-back speed),
a 2.9 ms 1 x 1 convolution over other buffers (a "heavy" neighbour), that and then its input
read back into the caches, its output written again, both, the same kernel on other buffers,
and a 3 ms sleep. Medians of ``calls`` calls, then the median over ``rounds`` rounds. On the
2-vCPU Zen 3 of 2026-11-30 the latency-bound kernels (a grouped and a depthwise convolution)
ran about 2x their back-to-back time after any other kernel or the pause, whatever was in the
caches; dense convolutions lost 0-16%. Run it where `perf stat` can read hardware counters
(``perf stat -e ... python benchmarks/neighbours.py``) to find out why.
"""

from __future__ import annotations

# first, before TVM loads torch: paragraph sets libgomp's spin count (paragraph/__init__.py)
import paragraph  # noqa: F401

# isort: split
import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import torch  # noqa: E402
import tvm_ffi  # noqa: E402

from paragraph.files import atomic_write_json  # noqa: E402
from paragraph.machine import describe_machine  # noqa: E402
from paragraph.tvm_interop.runtime.library import native  # noqa: E402
from paragraph.tvm_interop.runtime.library.names import VendorOp  # noqa: E402

# name: (input NHWC, weight OHWI, VendorOp fields, output NHWC)
CASES = {
    "grouped 3x3 s2, 32 groups (56x56x256)": (
        (1, 56, 56, 256), (256, 3, 3, 8),
        {"stride": (2, 2), "padding": (1, 1), "groups": 32}, (1, 28, 28, 256)),
    "depthwise 3x3 (56x56x144)": (
        (1, 56, 56, 144), (144, 3, 3, 1), {"padding": (1, 1), "groups": 144}, (1, 56, 56, 144)),
    "dense 3x3 (56x56x64 -> 64)": (
        (1, 56, 56, 64), (64, 3, 3, 64), {"padding": (1, 1)}, (1, 56, 56, 64)),
    "dense 3x3 (28x28x128 -> 128)": (
        (1, 28, 28, 128), (128, 3, 3, 128), {"padding": (1, 1)}, (1, 28, 28, 128)),
    "1x1 (28x28x512 -> 128)": ((1, 28, 28, 512), (128, 1, 1, 512), {}, (1, 28, 28, 128)),
}


def _bind(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
          digest: str, threads: int, **fields) -> Callable[[], None]:
    """The vendor convolution of ``fields`` (bias, relu) on these tensors, bound."""
    op = VendorOp("conv2d", layout="NHWC", bias=True, act="relu", weight=digest, **fields)
    kernel = native.bind(op.name, tuple(tvm_ffi.from_dlpack(t) for t in (x, w, b, out)), threads)
    if kernel is None:
        raise SystemExit(f"no C++ kernel for {op.name}: {native.reason()}")
    return kernel


def _median_after(prep: Callable[[], object], kernel: Callable[[], None], calls: int) -> float:
    """The median microseconds of ``kernel`` called right after ``prep``, ``calls`` times."""
    times = []
    for _ in range(calls):
        prep()
        start = time.perf_counter()
        kernel()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _preps(heavy: Callable[[], None], twin: Callable[[], None], x: torch.Tensor,
           out: torch.Tensor) -> dict[str, Callable[[], object]]:
    """The steps a kernel is timed after: ``heavy`` the neighbour, ``twin`` the same kernel on
    other buffers, ``x`` and ``out`` the kernel's input and output."""
    return {
        "again": lambda: None,
        "after a heavy kernel": heavy,
        "after it, input read again": lambda: (heavy(), x.sum()),
        "after it, output written again": lambda: (heavy(), out.zero_()),
        "after it, both": lambda: (heavy(), out.zero_(), x.sum()),
        "after it, then the kernel on other buffers": lambda: (heavy(), twin()),
        "after the kernel on other buffers": twin,
        "after a 3 ms sleep": lambda: time.sleep(0.003),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)

    def tensors(xs, ws, os_):
        return (torch.randn(*xs, generator=gen), torch.randn(*ws, generator=gen) * 0.1,
                torch.randn(ws[0], generator=gen), torch.empty(*os_))

    hx, hw, hb, hout = tensors((1, 56, 56, 256), (256, 1, 1, 256), (1, 56, 56, 256))
    heavy = _bind(hx, hw * 0.6, hb, hout, "1", args.threads)
    kernels = {}
    for i, (name, (xs, ws, fields, os_)) in enumerate(CASES.items()):
        x, w, b, out = tensors(xs, ws, os_)
        twin = _bind(*tensors(xs, ws, os_), f"{2 * i + 3:x}", args.threads, **fields)
        kernels[name] = (_bind(x, w, b, out, f"{2 * i + 2:x}", args.threads, **fields),
                         twin, x, out)
    for _ in range(20):  # past the forms' timing: each kernel runs its chosen form
        heavy()
        for kernel, twin, _, _ in kernels.values():
            kernel()
            twin()
    results = {}
    for name, (kernel, twin, x, out) in kernels.items():
        preps = _preps(heavy, twin, x, out)
        rounds: dict[str, list[float]] = {p: [] for p in preps}
        for _ in range(args.rounds):
            for p, prep in preps.items():
                rounds[p].append(_median_after(prep, kernel, args.calls))
        results[name] = {p: round(statistics.median(v), 1) for p, v in rounds.items()}
        print(name, flush=True)
        for p, us in results[name].items():
            print(f"    {p:45s} {us:9.1f} us")
    if args.json:
        atomic_write_json(args.json, {"benchmark": "neighbours", "threads": args.threads,
                                      "calls": args.calls, "rounds": args.rounds,
                                      "machine": describe_machine(), "cases_us": results})
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
