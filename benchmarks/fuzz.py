"""Differential fuzzing of paragraph (``make fuzz``): random graphs (`fuzz_graphs`) through every
search, schedule, kernel source and vendor form (`fuzz_run`), compared with the numpy
reference of the original graph; failures minimised and written to a report.

    python benchmarks/fuzz.py --cases 10000 --seed 0 [--steps 6] [--every] [--timeout 300]

Case ``i`` is the graph of seed ``SEED + i``. Cases run in batches in worker processes (one
import of TVM per batch), each case under a timeout: a worker that dies is a crash of the case
it was running, one that stops answering a hang; the batch goes on in a new worker. A failure
(a mismatch, an exception other than a `ParagraphError` refusing invalid input, ids out of
range accepted, a crash, a hang) is minimised: the smallest subgraph of its graph (the steps
one value needs, that value the only output) that still fails the same way in the same
combination, each try in a worker of its own. The report (`benchmarks/results/fuzz-cpu.json`
by default) holds the cases and seeds, the combinations, the machine, versions, date and load,
the cases a minute, and per failure its seed, what it was, where, its minimised graph (a
recipe `fuzz_graphs.module` builds again) and what fixed it (``fixed_by``, filled in by hand).

A run longer than one sitting goes in segments: ``--resume`` continues the report's run from the
seed after its last, until the report holds ``--cases`` cases in all. Each segment is recorded
with its seeds, counts, seconds, load and the commit it ran (``segments``); the report's totals
are the sums over its segments. A report written before segments existed is read as one.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPORT = HERE / "results" / "fuzz-cpu.json"
SPECIAL_REPORT = HERE / "results" / "fuzz-special-cpu.json"  # --special: NaN and infinities
GPU_REPORT = HERE / "results" / "gpu-fuzz.json"  # --target cuda (tools/gpu/checks.sh fuzz)
# failures found and fixed while the fuzzer was written (their graphs are regression tests in
# tests/test_fuzz_regressions.py); every report carries them. Seeds are those of the generator
# of the day: it has drawn other graphs since (epilogue chains), the minimised graph stays
FIXED = [{
    "seed": 252, "what": "error",
    "where": "import (every combination)",
    "detail": "GraphError: avg_pool2d with ceil_mode: Relax types its output 2x15x2x16, "
              "paragraph's shape function said 2x15x2x17",
    "minimised": {"graph": "inputs [('float32', [1, 2, 3, 32])]\nv1 = avg_pool2d(v0; "
                           "pool_size 1x1, strides 2x2, ceil_mode) -> [1, 2, 2, 16]",
                  "test": "tests/test_fuzz_regressions.py::seed-252-ceil-mode-pool"},
    "fixed_by": "a012865 ops: a ceil_mode pool drops a last window that would start past the "
                "input and its leading padding, as Relax's inference does",
}, {
    "seed": 1337, "what": "error",
    "where": "vendor/none/ios-parallel (plan), and every IOS schedule",
    "detail": "ParagraphError ScheduleError: schedule 'ios-parallel': stages must partition "
              "the kernels",
    "minimised": {"graph": "inputs [('float32', [13, 16, 3])]\nv1 = reshape(v0) -> "
                           "[13, 4, 4, 3]\nv2 = reshape(v0) -> [13, 48]\noutputs [v1, v2]",
                  "test": "tests/test_fuzz_regressions.py::seed-1337-views-only-ios"},
    "fixed_by": "4c6680b ios: a program of views alone gets the stage its views "
                "are placed in",
}]


# ---------------------------------------------------------------------------- worker side
def worker(args: argparse.Namespace) -> None:
    """Run the cases of ``args.seeds`` (or one JSON job per line of stdin with ``--jobs``),
    printing a JSON line as each starts and ends."""
    # here, not at the top: the driver imports paragraph only once it has put this checkout
    # first on its path (`main`), as the workers' PYTHONPATH does (`_environment`)
    import fuzz_graphs
    import fuzz_run

    kernels = tuple(args.kernels.split(","))

    def emit(**line: Any) -> None:
        print(json.dumps(line), flush=True)

    if args.jobs:  # minimisation: a recipe and the combination it failed in
        for text in sys.stdin:
            job = json.loads(text)
            combo = fuzz_run.Combination(*job["combo"][:2], tuple(job["combo"][2]))
            emit(start=job["id"])
            outcome = fuzz_run.run_case(job["recipe"], [combo], meter=args.meter,
                                        forms=not args.no_forms, target=args.target)
            emit(done=job["id"], runs=outcome.runs, combos=len(outcome.combos),
                 failures=[f.as_json() for f in outcome.failures])
        return
    for seed in (int(s) for s in args.seeds.split(",")):
        emit(start=seed)
        recipe = fuzz_graphs.recipe(fuzz_graphs.SeededDraw(seed), seed, args.steps)
        if args.special:  # NaN and infinities in its inputs (`fuzz_graphs.inputs`)
            recipe["special"] = True
        outcome = fuzz_run.run_case(recipe, fuzz_run.combinations(seed, args.every, kernels),
                                    meter=args.meter, forms=not args.no_forms,
                                    target=args.target)
        emit(done=seed, runs=outcome.runs, combos=len(outcome.combos), onnx=outcome.onnx,
             failures=[f.as_json() for f in outcome.failures],
             ops=[s["op"] + (f".{s['attrs']['fn']}" if "fn" in s["attrs"] else "")
                  for s in recipe["steps"]])


# ---------------------------------------------------------------------------- driver side
def _worker_command(args: argparse.Namespace, extra: list[str]) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--worker", "--steps",
            str(args.steps), "--kernels", args.kernels, "--meter", args.meter,
            *(["--target", args.target] if args.target else []),
            *(["--every"] if args.every else []), *(["--no-forms"] if args.no_forms else []),
            *(["--special"] if args.special else []),
            *extra]


class _Worker:
    """A worker process and a thread reading its lines into a queue."""

    def __init__(self, command: list[str], stdin: str | None = None) -> None:
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=HERE.parent,
                                     env=_environment(), start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()
        assert self.proc.stdin is not None
        if stdin is not None:
            self.proc.stdin.write(stdin)
        self.proc.stdin.close()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line)
            del self.err[:-40]  # the tail is what a crash report needs

    def next(self, timeout: float) -> dict[str, Any] | None:
        """The next JSON line; None when the worker ended; raises queue.Empty on timeout."""
        while True:
            line = self.lines.get(timeout=timeout)
            if line is None:
                return None
            if line.startswith("{"):
                return dict(json.loads(line))

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its process group: the worker alone
        except ProcessLookupError:
            pass
        self.proc.wait()

    def why_ended(self) -> str:
        rc = self.proc.wait()
        sig = f" (signal {-rc}: {signal.Signals(-rc).name})" if rc < 0 else ""
        tail = "".join(self.err[-6:]).strip()
        return f"worker exited with {rc}{sig}" + (f"; stderr: {tail[-800:]}" if tail else "")


def _environment() -> dict[str, str]:
    """The workers' environment: the benchmarks importable, and a cache directory of the
    fuzzer's own (`paragraph.files.cache_dir`) unless one is set, so that its kernel costs and
    drawn choices never reach the user's cost database (the native libraries are shared)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), str(HERE),
                                         env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if "PARAGRAPH_CACHE_DIR" not in env:
        own = Path.home() / ".cache" / "paragraph-fuzz"
        user_native = Path.home() / ".cache" / "paragraph" / "native"
        user_native.mkdir(parents=True, exist_ok=True)
        own.mkdir(parents=True, exist_ok=True)
        if not (own / "native").exists():
            (own / "native").symlink_to(user_native, target_is_directory=True)
        env["PARAGRAPH_CACHE_DIR"] = str(own)
    return env


def run_cases(args: argparse.Namespace, seeds: list[int], log: Any,
              after_batch: Any = None) -> list[dict[str, Any]]:
    """Every seed's case in batches of workers: one result per seed (``done`` lines, or a
    crash or hang made into one); ``after_batch`` hears the results so far after each batch
    (the report is written then: a long run stopped early keeps what it ran)."""
    results: list[dict[str, Any]] = []
    pending = list(seeds)
    started = time.perf_counter()
    while pending:
        batch, pending = pending[:args.batch], pending[args.batch:]
        w = _Worker(_worker_command(args, ["--seeds", ",".join(map(str, batch))]))
        todo = list(batch)
        current: int | None = None
        while todo:
            try:
                line = w.next(args.timeout if current is not None else args.timeout + 60)
            except queue.Empty:
                w.kill()
                seed = current if current is not None else todo[0]
                results.append({"seed": seed, "runs": 0, "combos": 0, "failures": [
                    {"what": "hang", "where": "case", "detail":
                     f"no answer within {args.timeout:.0f} s"}]})
                todo.remove(seed)
                w = _Worker(_worker_command(args, ["--seeds", ",".join(map(str, todo))])) \
                    if todo else w
                current = None
                continue
            if line is None:  # the worker died
                seed = current if current is not None else todo[0]
                results.append({"seed": seed, "runs": 0, "combos": 0, "failures": [
                    {"what": "crash", "where": "case", "detail": w.why_ended()}]})
                todo.remove(seed)
                if todo:
                    w = _Worker(_worker_command(args, ["--seeds", ",".join(map(str, todo))]))
                current = None
                continue
            if "start" in line:
                current = int(line["start"])
                continue
            seed = int(line.pop("done"))
            results.append({"seed": seed, **line})
            todo.remove(seed)
            current = None
            if line["failures"]:
                log(f"  seed {seed}: {line['failures'][0]['what']} in "
                    f"{line['failures'][0]['where']}: {line['failures'][0]['detail'][:200]}")
        w.kill()
        done = len(results)
        minutes = (time.perf_counter() - started) / 60
        log(f"{done}/{len(seeds)} cases, {sum(bool(r['failures']) for r in results)} failing, "
            f"{done / max(minutes, 1e-9):.1f} cases/min")
        if after_batch is not None:
            after_batch(results)
    return results


def _try_jobs(args: argparse.Namespace, jobs: list[dict[str, Any]]) -> dict[int, list[dict]]:
    """Failures of each minimisation job (a crash or hang counts), each job in a worker of
    its own so that one that dies takes only itself."""
    out: dict[int, list[dict]] = {}
    for job in jobs:
        w = _Worker(_worker_command(args, ["--jobs"]), json.dumps(job) + "\n")
        failures: list[dict] = []
        try:
            while True:
                line = w.next(args.timeout)
                if line is None:
                    failures = [{"what": "crash", "where": "case", "detail": w.why_ended()}]
                    break
                if "done" in line:
                    failures = line["failures"]
                    break
        except queue.Empty:
            failures = [{"what": "hang", "where": "case", "detail": "timeout"}]
        w.kill()
        out[job["id"]] = failures
    return out


def _where_combo(where: str) -> list[Any] | None:
    """The combination (kernels, search, [schedule]) a failure's ``where`` names; None for a
    crash or hang of a whole case (minimised over all its combinations)."""
    head = where.split(" ")[0]
    parts = head.split("/")
    if len(parts) != 3:
        return None
    return [parts[0], parts[1], [parts[2]]]


def _subrecipes(recipe: dict[str, Any]) -> list[dict[str, Any]]:
    """Every value's own graph (the steps it needs, it the only output), smallest first."""
    n_in = len(recipe["inputs"])
    steps = recipe["steps"]
    out = []
    for v in range(n_in, n_in + len(steps)):
        need: set[int] = set()
        stack = [v]
        while stack:
            u = stack.pop()
            if u >= n_in and u not in need:
                need.add(u)
                stack.extend(steps[u - n_in]["args"])
        keep = sorted(need)
        renumber = {i: i for i in range(n_in)}
        new_steps = []
        for u in keep:
            renumber[u] = n_in + len(new_steps)
            step = dict(steps[u - n_in])
            new_steps.append({**step, "args": [renumber[a] for a in step["args"]]})
        out.append({**recipe, "steps": new_steps, "outputs": [renumber[v]]})
    # the failing case whole but for the outputs one at a time (an aliasing output)
    out += [{**recipe, "outputs": [o]} for o in dict.fromkeys(recipe["outputs"])
            if len(recipe["outputs"]) > 1]
    out.sort(key=lambda r: len(r["steps"]))
    return out


def minimise(args: argparse.Namespace, seed: int, failure: dict[str, Any],
             log: Any) -> dict[str, Any]:
    """The smallest subgraph of seed's graph failing the same way in the same combination."""
    import fuzz_graphs  # after `main` put this checkout first on the path (see `worker`)
    import fuzz_run

    recipe = fuzz_graphs.recipe(fuzz_graphs.SeededDraw(seed), seed, args.steps)
    if args.special:
        recipe["special"] = True
    combo = _where_combo(failure["where"])
    combos = [combo] if combo is not None else [
        [c.kernels, c.search, list(c.schedules)]
        for c in fuzz_run.combinations(seed, args.every, tuple(args.kernels.split(",")))]
    best = recipe
    for sub in _subrecipes(recipe):
        if len(sub["steps"]) > len(best["steps"]) or sub == best:
            break
        jobs = [{"id": i, "recipe": sub, "combo": c} for i, c in enumerate(combos)]
        found = _try_jobs(args, jobs)
        if any(f["what"] == failure["what"] for fs in found.values() for f in fs):
            best = sub
            combos = [combos[i] for i, fs in found.items()
                      if any(f["what"] == failure["what"] for f in fs)][:1]
            break
    log(f"  seed {seed} minimised: {len(recipe['steps'])} -> {len(best['steps'])} steps")
    return {"recipe": best, "combination": combos[0] if len(combos) == 1 else None,
            "graph": fuzz_graphs.describe(best)}


def _load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _commit() -> str | None:
    """The commit this checkout is at (None outside git): each segment of a run says which
    code it checked."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=HERE.parent,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _as_segment(report: dict[str, Any]) -> dict[str, Any]:
    """A report written before segments existed, as the first segment of its run."""
    keys = ("command", "commit", "date", "finished", "load_average_before", "load_average",
            "cases", "seeds", "programs_compared", "executor_runs", "checked_by_onnxruntime",
            "seconds", "failing_cases", "steps_drawn", "note")
    return {k: report.get(k) for k in keys}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=200)
    p.add_argument("--seed", type=int, default=0, help="the first case's seed")
    p.add_argument("--steps", type=int, default=6, help="at most this many steps per graph")
    p.add_argument("--every", action="store_true",
                   help="every kernel source x search method, each planning every schedule")
    p.add_argument("--kernels", default="tvm,vendor,auto")
    p.add_argument("--meter", choices=("drawn", "local"), default="drawn")
    p.add_argument("--no-forms", action="store_true", help="do not force each vendor form")
    p.add_argument("--special", action="store_true",
                   help="NaN and infinities in every case's float inputs (report: "
                        "fuzz-special-cpu.json)")
    p.add_argument("--batch", type=int, default=50, help="cases per worker process")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    p.add_argument("--no-minimise", action="store_true")
    p.add_argument("--target", default=None,
                   help="where the programs run: this CPU (default), or cuda (the CUDA pass, "
                        "on a GPU; its report gpu-fuzz.json)")
    p.add_argument("--report", default=None,
                   help=f"the report (default {REPORT.name}, {GPU_REPORT.name} for cuda)")
    p.add_argument("--resume", action="store_true",
                   help="continue the report's run (from the seed after its last) until it "
                        "holds --cases cases in all")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seeds", help=argparse.SUPPRESS)
    p.add_argument("--jobs", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return
    sys.path.insert(0, str(HERE))  # the driver minimises with the worker's modules
    sys.path.insert(0, str(HERE.parent))
    # after the path above: this checkout's paragraph, the one the workers run
    from paragraph.files import atomic_write_json
    from paragraph.machine import describe_machine
    from paragraph.planner import SCHEDULES
    from paragraph.tvm_interop.runtime.executor import gpu_available
    from paragraph.tvm_interop.runtime.target import is_gpu, resolve_target

    gpu = is_gpu(resolve_target(args.target))
    if args.report is None:
        args.report = str(GPU_REPORT if gpu else SPECIAL_REPORT if args.special else REPORT)
    if gpu and not gpu_available():
        sys.exit(f"fuzz.py --target {args.target}: no CUDA device on this machine; the CUDA "
                 "pass runs where a GPU is lent (tools/gpu/checks.sh fuzz)")

    def log(line: str) -> None:
        print(line, flush=True)

    load_before = _load_average()
    started = time.perf_counter()
    command = "python benchmarks/fuzz.py " + " ".join(sys.argv[1:] if argv is None else argv)
    earlier: list[dict[str, Any]] = []  # the segments of the run this one continues
    earlier_failures: list[dict[str, Any]] = []
    first, count = args.seed, args.cases
    if args.resume and Path(args.report).exists():
        previous = json.loads(Path(args.report).read_text())
        earlier = previous.get("segments") or [_as_segment(previous)]
        earlier_failures = list(previous.get("failures", []))
        first = max(s["seeds"][1] for s in earlier if s["seeds"]) + 1
        count = args.cases - sum(s["cases"] for s in earlier)
        if count <= 0:
            log(f"{args.report} already holds {args.cases - count} cases: nothing to run")
            return
        log(f"resuming {args.report}: {args.cases - count} cases done, {count} to run from "
            f"seed {first}")
    seeds = list(range(first, first + count))

    def write(results: list[dict[str, Any]], failures: list[dict[str, Any]],
              finished: bool) -> dict[str, Any]:
        seconds = time.perf_counter() - started
        done = sorted(r["seed"] for r in results)
        found = failures or [{"seed": r["seed"], **r["failures"][0], "fixed_by": None}
                             for r in results if r["failures"]]
        segment = {
            "command": command, "commit": _commit(), "date": _now(),
            "finished": finished,  # False: stopped early, these are its cases so far
            "load_average_before": load_before, "load_average": _load_average(),
            "cases": len(results), "seeds": [done[0], done[-1]] if done else [],
            "programs_compared": sum(r["combos"] for r in results),
            "executor_runs": sum(r["runs"] for r in results),
            "checked_by_onnxruntime": sum(bool(r.get("onnx")) for r in results),
            "seconds": round(seconds, 1),
            "failing_cases": sum(bool(r["failures"]) for r in results),
            "steps_drawn": dict(sorted(Counter(
                op for r in results for op in r.get("ops", ())).items())),
        }
        segments = [*earlier, segment]

        def total(key: str) -> Any:
            return sum(s.get(key) or 0 for s in segments)

        steps = Counter[str]()
        for s in segments:
            steps.update(s.get("steps_drawn") or {})
        cases, all_seconds = total("cases"), total("seconds")
        report = {
            "benchmark": "fuzz",
            "command": command,
            # False: the run stopped early (or has fewer cases than asked), these are its cases
            "finished": finished and cases >= args.cases,
            "machine": describe_machine(),
            "load_average_before": load_before,
            "load_average": _load_average(),
            "cases": cases,
            "seeds": [min(s["seeds"][0] for s in segments if s["seeds"]),
                      max(s["seeds"][1] for s in segments if s["seeds"])] if cases else [],
            "max_steps": args.steps,
            "mode": "every" if args.every else "shared",
            "special_values": args.special,  # NaN and infinities in the inputs
            "target": args.target or "this CPU",
            "kernels": args.kernels.split(","),
            "meter": args.meter,
            "forms_forced": not args.no_forms,
            "schedules": list(SCHEDULES),
            "programs_compared": total("programs_compared"),
            "executor_runs": total("executor_runs"),
            "checked_by_onnxruntime": total("checked_by_onnxruntime"),
            "seconds": round(all_seconds, 1),
            "cases_per_minute": round(cases / (all_seconds / 60), 1) if all_seconds else 0.0,
            "failing_cases": total("failing_cases"),
            "failures": earlier_failures + found,
            "steps_drawn": dict(sorted(steps.items())),
            "fixed": FIXED,
            "segments": segments,
        }
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.report, report)
        return report

    results = run_cases(args, seeds, log, lambda so_far: write(so_far, [], False))
    failures = []
    for r in sorted(results, key=lambda r: r["seed"]):
        for f in r["failures"][:1]:  # the first failure of a case: the others often follow
            entry = {"seed": r["seed"], **f, "fixed_by": None}
            if not args.no_minimise:
                entry["minimised"] = minimise(args, r["seed"], f, log)
            failures.append(entry)
    report = write(results, failures, True)
    segment = report["segments"][-1]
    log(f"{len(results)} cases in {segment['seconds']:.0f} s, {segment['programs_compared']} "
        f"programs compared, {len(failures)} failing; the report: {report['cases']} cases "
        f"({report['cases_per_minute']} cases/min), {report['failing_cases']} failing; wrote "
        f"{args.report}")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
