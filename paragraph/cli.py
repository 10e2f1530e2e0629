"""The ``paragraph`` command line (tvmc-like verbs): ``models``, ``run``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from paragraph.errors import ParagraphError


def _say(msg: str) -> None:
    print(msg, flush=True)


class _Step:
    """Prints ``what ...`` then ``done (1.2 s)`` around a block: progress for long work."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> _Step:
        print(f"{self.what} ...", end=" ", flush=True)
        self.start = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        took = time.perf_counter() - self.start
        print(f"{'done' if exc_type is None else 'failed'} ({took:.1f} s)", flush=True)


def parse_shapes(items: Sequence[str] | None) -> dict[str, tuple[int, ...]] | None:
    """``["x:1,3,224,224", ...]`` -> ``{"x": (1, 3, 224, 224)}`` for ``--input-shape``."""
    if not items:
        return None
    shapes = {}
    for item in items:
        name, sep, dims = item.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.replace("x", ",").split(","))
        except ValueError:
            raise ParagraphError(f"--input-shape {item!r}: expected NAME:D1,D2,...") from None
    return shapes


def load_model(name: str, *, reduced: bool = False, batch: int = 1,
               input_shapes: dict[str, tuple[int, ...]] | None = None):
    """A zoo model by name or a model file (``.onnx``) as a Relax module, with a label."""
    from paragraph import models

    if name in models.list():
        return models.get(name, reduced=reduced, batch=batch), (
            f"{name}{' (reduced)' if reduced else ''}, batch {batch}")
    if Path(name).suffix or Path(name).exists():
        from paragraph.tvm_interop import load

        if reduced:
            raise ParagraphError("--reduced applies to zoo models only")
        return load(name, input_shapes=input_shapes), name
    raise ParagraphError(f"unknown model {name!r}: give a zoo name "
                         f"({', '.join(models.list())}) or a path to an .onnx file")


def cmd_models(args: argparse.Namespace) -> int:
    from paragraph import models

    rows = [(n, "x".join(map(str, models.input_shape(n))),
             "x".join(map(str, models.input_shape(n, reduced=True))), models.describe(n))
            for n in models.list()]
    head = ("name", "input", "reduced input", "description")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(3)]
    for r in [head] + rows:
        _say("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3])
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import tvm

    from paragraph.tvm_interop import from_relax, random_inputs, to_relax
    from paragraph.tvm_interop.vm import build_vm, local_cpu_target, run_vm, time_calls

    with _Step(f"importing {args.model}"):
        mod, label = load_model(args.model, reduced=args.reduced, batch=args.batch,
                                input_shapes=parse_shapes(args.input_shape))
    with _Step("round trip Relax -> paragraph graph -> Relax"):
        graph = from_relax(mod)
        roundtrip = to_relax(graph)
    opaque = sum(n.kind == "opaque" for n in graph.nodes)
    _say(f"  {graph.summary()}")
    _say(f"  {len(graph.ops)} operators, {opaque} opaque; hash {graph.structural_hash()[:16]}")
    target = local_cpu_target(args.threads)
    with _Step(f"compiling both with TVM for {target.attrs.get('mcpu', 'llvm')} "
               f"({target.attrs['num-cores']} cores)"):
        both = tvm.IRModule({**{gv: f for gv, f in mod.functions.items()},
                             tvm.ir.GlobalVar("main_roundtrip"):
                             roundtrip["main"].without_attr("global_symbol")})
        vm = build_vm(both, target)
    inputs = random_inputs(mod, seed=args.seed)
    with _Step("checking the round trip's outputs against the original's"):
        expected = run_vm(vm, inputs, "main")
        got = run_vm(vm, inputs, "main_roundtrip")
    worst = max(float(np.max(np.abs(a - b))) if a.size else 0.0
                for a, b in zip(expected, got))
    ok = len(expected) == len(got) and all(
        a.shape == b.shape and np.allclose(a, b, rtol=1e-5, atol=1e-5)
        for a, b in zip(expected, got))
    _say(f"  {len(got)} output(s), max abs difference {worst:.3g}: "
         f"{'equal' if ok else 'DIFFERENT'}")
    if not ok:
        return 1
    args_tvm = [tvm.runtime.tensor(a) for a in inputs]
    with _Step(f"timing {args.repeat} runs"):
        timing = time_calls(lambda: vm["main_roundtrip"](*args_tvm), args.repeat)
    _say(f"{label}: median {timing.median_ms:.2f} ms (p10 {timing.percentile_ms(10):.2f}, "
         f"p90 {timing.percentile_ms(90):.2f}) over {args.repeat} runs, TVM VM on the CPU")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``paragraph`` command."""
    from paragraph import __version__

    parser = argparse.ArgumentParser(
        prog="paragraph", description="Graph substitution and inter-operator parallelism "
        "for Apache TVM (Relax).")
    parser.add_argument("--version", action="version", version=f"paragraph {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("models", help="list the built-in model zoo")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("run", help="import a model, round-trip it through paragraph's graph, "
                       "compile it with TVM, check outputs and time it")
    p.add_argument("model", help="zoo model name (see `paragraph models`) or a .onnx file")
    p.add_argument("--reduced", action="store_true",
                   help="zoo model at reduced size (same topology, small channels)")
    p.add_argument("--batch", type=_positive, default=1, help="batch size (zoo models)")
    p.add_argument("--repeat", type=_positive, default=10, help="timed runs (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--threads", type=_positive, default=None,
                   help="CPU threads for TVM kernels (default: all cores)")
    p.add_argument("--input-shape", action="append", metavar="NAME:D1,D2,...",
                   help="static shape for a dynamic model input (repeatable)")
    p.set_defaults(func=cmd_run)
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``paragraph`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ParagraphError as e:
        print(f"\nparagraph: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nparagraph: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
