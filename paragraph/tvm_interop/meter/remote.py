"""Measuring on a device behind TVM's RPC tracker (``tvm.rpc``).

A paragraph RPC server is TVM's own (``tvm.rpc.Server``) with paragraph's measuring functions
registered in it (`register`, its ``server_init_callback``):

    python -m paragraph.tvm_interop.meter.remote --tracker HOST:PORT --key KEY

`Remote` (``--rpc HOST:PORT:KEY``) asks the tracker for a session on such a server, learns the
device's target and cores (`Remote.target`), and times whole programs there: each program
under its schedule becomes a one-file artifact (`paragraph.tvm_interop.build.artifact`), uploaded
into the session's work directory, loaded by the server and run side by side with the others
in blocks (`paragraph.timing.time_in_blocks`) on the parallel executor, outputs compared with
the first program's on the same inputs. `Remote` is a `Meter`
(`paragraph.tvm_interop.meter.protocol`): `Remote.kernel_times` times a program's kernels there
(critical-path's kernel costs, the search's kernel signatures) and `Remote.stage_timer` IOS's
stages: the program is uploaded once, and each stage, named by its kernel ids and strategy, is
timed there by IOS's protocol (`paragraph.tvm_interop.meter.stages`).
TVM's RPC gives whoever reaches the server full remote code execution: run it only on a
trusted network (TVM's own warning).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import struct
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import rpc

from paragraph.errors import ParagraphError, exit_status, reraise_interrupt
from paragraph.inputs import sample_inputs
from paragraph.machine import cpu_count, describe_machine
from paragraph.outputs import max_difference
from paragraph.passes.ios import IOSOptions
from paragraph.passes.schedule import sequential
from paragraph.progress import Log
from paragraph.schedule import Schedule
from paragraph.timing import Config, time_in_blocks
from paragraph.tvm_interop.build.artifact import read_artifact, write_artifact
from paragraph.tvm_interop.measure.costdb import CostDB
from paragraph.tvm_interop.measure.device import (
    Peaks,
    kernel_costs,
    measure_cpu_peaks,
    measure_handoff,
)
from paragraph.tvm_interop.meter.protocol import Groups
from paragraph.tvm_interop.meter.runs import require_equal
from paragraph.tvm_interop.meter.stages import LocalStages, sequence_seconds
from paragraph.tvm_interop.runtime.executor import make_executor
from paragraph.tvm_interop.runtime.memory import plan_memory
from paragraph.tvm_interop.runtime.program import KernelProgram
from paragraph.tvm_interop.runtime.target import local_cpu_target
from paragraph.tvm_interop.runtime.vm import run_vm

PREFIX = "paragraph.rpc."


# ---------------------------------------------------------------------------- server side
def _workpath(name: str) -> str:
    """Where the RPC session keeps an uploaded file (its own temporary directory)."""
    return str(tvm.get_global_func("tvm.rpc.server.workpath")(name))


def _device() -> str:
    """This machine as the client needs it: its target (as paragraph compiles for it), cores
    and description, JSON."""
    return json.dumps({"target": json.loads(str(local_cpu_target())), "cores": cpu_count(),
                       "machine": describe_machine()})


def _time(names: str, blocks: int, block: int) -> str:
    """Load the uploaded artifacts ``names`` (a JSON list), run each once on the same sample
    inputs (their outputs' differences from the first's), then time them side by side:
    ``blocks`` rounds of ``block`` runs each. JSON: median seconds and differences (and the
    first's from the TVM VM running the same kernels)."""
    artifacts = [read_artifact(_workpath(n)) for n in json.loads(names)]
    executors = [make_executor(a.program, a.schedule, plan=a.memory) for a in artifacts]
    try:
        graph = artifacts[0].program.graph
        inputs = sample_inputs([graph[i].type for i in graph.inputs],
                               artifacts[0].program.input_ranges)
        outs = [[np.asarray(o) for o in ex.run(*inputs)] for ex in executors]
        diffs = [max_difference(outs[0], o) for o in outs]
        program = artifacts[0].program  # the first against the TVM VM over its own kernels
        vm_diff = max_difference(run_vm(program.vm(), inputs, device=program.device), outs[0])
        configs = [Config(str(i), partial(ex.run, *inputs, copy_outputs=False))
                   for i, ex in enumerate(executors)]
        for c in configs:  # a first block each, untimed: a process's first runs are slow
            for _ in range(block):
                c.run()
        medians = time_in_blocks(configs, blocks, block)
    finally:
        for ex in executors:
            ex.close()
    def finite(d: float) -> float | None:
        return d if d != float("inf") else None

    return json.dumps({"seconds": [statistics.median(m) for m in medians],
                       "max_difference": [finite(d) for d in diffs],
                       "vm_difference": finite(vm_diff)})


def _kernels(name: str, threads: str) -> str:
    """Seconds per kernel of an uploaded artifact's program on each of ``threads`` (a JSON
    list of thread counts), in model order (`kernel_costs`) after one run on sample inputs
    (every buffer holds what a run writes: an index is within its table), JSON
    ``[{node id: seconds}, ...]``."""
    art = read_artifact(_workpath(name))
    graph = art.program.graph
    with make_executor(art.program, art.schedule, plan=art.memory) as ex:
        ex.run(*sample_inputs([graph[i].type for i in graph.inputs], art.program.input_ranges))
        costs = [kernel_costs(ex, threads=int(t)) for t in json.loads(threads)]
    return json.dumps([{str(k): v for k, v in c.items()} for c in costs])


# IOS stage timers of this session's uploaded programs, by artifact name (a session is one
# server process: TVM's RPC server forks one per client)
_TIMERS: dict[str, LocalStages] = {}


def _stages_open(name: str, protocol: str, seq_threads: int) -> str:
    """Load an uploaded program to time its stages (`_stage`) by ``protocol`` (JSON
    `IOSOptions` fields)."""
    art = read_artifact(_workpath(name))
    _TIMERS[name] = LocalStages(art.program, IOSOptions(**json.loads(protocol)), seq_threads)
    return name


def _stage(name: str, groups: str, strategy: str) -> float:
    """Seconds of one run of a stage (JSON kernel-id groups) of an opened program."""
    if name not in _TIMERS:
        raise ParagraphError(f"no stage timer {name!r} is open in this session")
    return _TIMERS[name].measure(tuple(tuple(int(k) for k in g) for g in json.loads(groups)),
                                 strategy)


def _stages_close(name: str) -> None:
    timer = _TIMERS.pop(name, None)
    if timer is not None:
        timer.close()


def _sequence(name: str, protocol: str, threads: int) -> float:
    """Seconds of an uploaded program's kernels in sequence on ``threads`` threads, by the
    stage protocol (`sequence_seconds`: IOS's merged-convolution stage)."""
    art = read_artifact(_workpath(name))
    return sequence_seconds(art.program, threads, IOSOptions(**json.loads(protocol)))


def _handoff() -> float:
    """Seconds for one worker thread to hand a result to another here (`measure_handoff`)."""
    return float(measure_handoff(None, str(local_cpu_target())))


def register() -> None:
    """Register paragraph's measuring functions in this process's TVM (an RPC server's
    ``server_init_callback``)."""
    tvm_ffi.register_global_func(PREFIX + "device", _device, override=True)
    tvm_ffi.register_global_func(PREFIX + "time", _time, override=True)
    tvm_ffi.register_global_func(PREFIX + "kernels", _kernels, override=True)
    tvm_ffi.register_global_func(PREFIX + "handoff", _handoff, override=True)
    for name, f in (("stages_open", _stages_open), ("stage", _stage),
                    ("stages_close", _stages_close), ("sequence", _sequence)):
        tvm_ffi.register_global_func(PREFIX + name, f, override=True)


def serve(tracker: str, key: str, host: str = "0.0.0.0", port: int = 9091,
          port_end: int = 9199) -> rpc.Server:
    """Start a paragraph RPC server (a subprocess) registered with the tracker at
    ``tracker`` ("HOST:PORT") under ``key``; returns it (``terminate()`` stops it)."""
    t_host, t_port = _host_port(tracker)
    return rpc.Server(host=host, port=port, port_end=port_end, tracker_addr=(t_host, t_port),
                      key=key, server_init_callback=register, silent=True)


# ---------------------------------------------------------------------------- client side
def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    try:
        return host, int(port)
    except ValueError:
        raise ParagraphError(f"expected HOST:PORT, got {text!r}") from None


def parse_address(text: str) -> tuple[str, int, str]:
    """``HOST:PORT:KEY`` -> (host, port, key), or a `ParagraphError` naming the problem."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[0] or not parts[2]:
        raise ParagraphError(f"--rpc expects HOST:PORT:KEY (the tracker and the device key), "
                             f"got {text!r}")
    try:
        port = int(parts[1])
    except ValueError:
        raise ParagraphError(f"--rpc {text!r}: the port {parts[1]!r} is not a number") from None
    return parts[0], port, parts[2]


def _probe_tracker(address: str, host: str, port: int, timeout: float) -> None:
    """Raise `ParagraphError` unless a TVM RPC tracker answers at ``host:port`` within
    ``timeout`` seconds. TVM's own connect retries a refused connection for a minute and then
    waits for the tracker's handshake with no time limit at all (a port that accepts and
    stays silent hung it for good): say at once what is there instead."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(struct.pack("<i", rpc.base.RPC_TRACKER_MAGIC))
            answer = b""
            while len(answer) < 4:
                chunk = sock.recv(4 - len(answer))
                if not chunk:
                    break
                answer += chunk
    except TimeoutError:
        raise ParagraphError(f"--rpc {address}: {host}:{port} did not answer as an RPC "
                             f"tracker within {timeout:g} s") from None
    except OSError as e:
        raise ParagraphError(f"--rpc {address}: no tracker at {host}:{port} "
                             f"({e.strerror or e})") from None
    if len(answer) < 4 or struct.unpack("<i", answer)[0] != rpc.base.RPC_TRACKER_MAGIC:
        raise ParagraphError(f"--rpc {address}: {host}:{port} is not a TVM RPC tracker (it "
                             "answered something else)")


class Remote:
    """A session on a paragraph RPC server, requested from a tracker (see the module
    docstring). A server serves one session at a time: ``timeout`` (seconds) bounds the wait
    for a free one. ``close`` (or the end of a ``with`` block) gives the device back."""

    def __init__(self, address: str, timeout: float = 60.0) -> None:
        host, port, key = parse_address(address)
        self.address, self.key = address, key
        _probe_tracker(address, host, port, min(timeout, 5.0))
        try:
            tracker = rpc.connect_tracker(host, port)
            # the tracker answers a request only when a device is free: bound the wait
            tracker._sock.settimeout(timeout)  # noqa: SLF001 - TVM offers no other way
            self.session: Any = tracker.request(key, priority=1, session_timeout=0,
                                                max_retry=1)
        except (RuntimeError, OSError) as e:
            raise ParagraphError(f"--rpc {address}: no free device with key {key!r} within "
                                 f"{timeout:.0f} s (none registered, or all busy with other "
                                 f"sessions): {e}") from None
        try:
            info = json.loads(str(self._call("device")))
        except Exception as e:  # noqa: BLE001 - any failure means the server is not ours
            raise ParagraphError(f"--rpc {address}: the server does not run paragraph's "
                                 "measuring functions (start it with `python -m "
                                 f"paragraph.tvm_interop.meter.remote`): {e}") from None
        self.target = tvm.target.Target(info["target"])
        self.cores = int(info["cores"])
        self.db: CostDB | None = None  # what the device measures is not this machine's
        self.tuning = ""
        self.machine: dict[str, Any] = info["machine"]
        self.vm_difference = float("nan")  # of the last `time`
        self._names = itertools.count()  # uploaded files are named apart

    @classmethod
    def device_target(cls, address: str, timeout: float = 60.0) -> tvm.target.Target:
        """The target of the device behind ``address`` (``HOST:PORT:KEY``), from a session
        held only as long as it takes to ask."""
        with cls(address, timeout) as remote:
            return remote.target

    def _call(self, name: str, *args: Any) -> Any:
        return self._on_device(f"running {name!r}",
                               lambda: self.session.get_function(PREFIX + name)(*args))

    def _upload(self, program: KernelProgram, schedule: Schedule, name: str) -> None:
        with tempfile.TemporaryDirectory(prefix="paragraph-rpc-") as tmp:
            path = Path(tmp) / name
            write_artifact(path, program, schedule, plan_memory(program.graph, schedule))
            self._on_device(f"uploading {name}",
                            lambda: self.session.upload(str(path), target=name))

    def _on_device(self, what: str, call: Callable[[], Any]) -> Any:
        """``call()`` on the session, where its failure (the device's server killed or gone,
        the connection lost, an error raised there) is one `ParagraphError` naming the device
        and what was being done, not TVM's internal check ("code == RPCCode::kReturn")."""
        if self.session is None:
            raise ParagraphError(f"--rpc {self.address}: the session is closed")
        try:
            return call()
        except ParagraphError:
            raise
        except Exception as e:  # noqa: BLE001 - TVM's RPC raises its own error types
            reraise_interrupt(e)
            text = (str(e).strip().splitlines() or [type(e).__name__])[-1].strip()
            lost = isinstance(e, OSError) or any(
                w in str(e) for w in ("kShutdown", "onnection", "ocket", "Broken pipe"))
            why = ("the device's server stopped or the connection to it was lost" if lost
                   else "it failed on the device")
            raise ParagraphError(f"--rpc {self.address}: {what}: {why} ({text[:200]})"
                                 ) from None

    def time(self, candidates: Sequence[tuple[KernelProgram, Schedule]], *, blocks: int = 5,
             block: int = 10) -> tuple[list[float], list[float]]:
        """Median seconds of each ``(program, schedule)`` run on the remote device side by
        side, and the max difference of each one's outputs from the first's there
        (``self.vm_difference``: the first's from the TVM VM there)."""
        names = [self._name("candidate") for _ in candidates]
        for (program, schedule), name in zip(candidates, names, strict=True):
            self._upload(program, schedule, name)
        out = json.loads(str(self._call("time", json.dumps(names), blocks, block)))
        diffs = [float("inf") if d is None else float(d) for d in out["max_difference"]]
        vm = out["vm_difference"]
        self.vm_difference = float("inf") if vm is None else float(vm)
        return [float(s) for s in out["seconds"]], diffs

    def _name(self, what: str) -> str:
        return f"{what}{next(self._names)}-{os.getpid()}.paragraph"

    def runs(self, candidates: Sequence[tuple[KernelProgram, Schedule]], *, repeat: int = 6,
             warmup: int = 2, block: int = 5, check: bool = False,
             fresh: bool = False) -> list[float]:
        """Median seconds of whole runs of each candidate side by side on the device (`time`;
        always fresh: nothing is cached); with ``check`` their outputs there must agree."""
        seconds, diffs = self.time(candidates, blocks=max(3, repeat), block=max(1, block))
        if check:
            require_equal(candidates, diffs, f" on {self.describe()}")
        return seconds

    def kernel_times(self, program: KernelProgram, threads: Sequence[int], *,
                     fill: bool = False, log: Log | None = None) -> list[dict[int, float]]:
        """Seconds per kernel (``{node id: seconds}``) of ``program`` on the device on each of
        ``threads`` threads, in model order, after one run on sample inputs (always: one
        upload for every thread count)."""
        name = self._name("kernels")
        self._upload(program, sequential(program.graph, cores=threads[0]), name)
        return [{int(k): float(v) for k, v in c.items()} for c in
                json.loads(str(self._call("kernels", name, json.dumps(list(threads)))))]

    def stage_timer(self, program: KernelProgram, options: IOSOptions,
                    seq_threads: int) -> RemoteStages:
        """Upload ``program`` to time its IOS stages there with ``options``' protocol."""
        name = self._name("stages")
        self._upload(program, sequential(program.graph), name)
        return RemoteStages(self, str(self._call("stages_open", name, _protocol(options),
                                                 seq_threads)))

    def sequence_seconds(self, program: KernelProgram, threads: int,
                         options: IOSOptions) -> float:
        """Seconds of ``program``'s kernels in sequence on ``threads`` threads there, by the
        stage protocol (IOS's merged-convolution stage, built here)."""
        name = self._name("sequence")
        self._upload(program, sequential(program.graph, cores=threads), name)
        return float(self._call("sequence", name, _protocol(options), threads))

    def peaks(self, target: tvm.target.Target) -> Peaks:
        """This machine's peak rates (cached in its cost database): the cost model's estimate
        for kernels left unmeasured is the only thing not measured on the device."""
        db = CostDB()
        try:
            return measure_cpu_peaks(db, "cpu")
        finally:
            db.close()

    def close(self) -> None:
        """End the session (the server takes the next client)."""
        self.session = None

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def measures(self, target: tvm.target.Target) -> bool:
        """Whether ``target`` is the device's own (programs are compiled for it here)."""
        return target.kind.name == self.target.kind.name

    def handoff(self, target: tvm.target.Target | None = None) -> float:
        """Seconds for one worker thread to hand a result to another on the device."""
        return float(self._call("handoff"))

    def describe(self) -> str:
        """One line: the device behind the tracker."""
        return (f"{self.key} at {self.address.rsplit(':', 1)[0]}: {self.machine.get('cpu', '?')}"
                f", {self.cores} cores")


class RemoteStages:
    """An uploaded program's IOS stages, timed on the device (a `StageTimer`)."""

    def __init__(self, remote: Remote, name: str) -> None:
        self.remote, self.name = remote, name

    def measure(self, groups: Groups, strategy: str) -> float:
        """Seconds of one run of a stage (kernel ids) there."""
        return float(self.remote._call("stage", self.name, json.dumps(groups), strategy))

    def close(self) -> None:
        if self.remote.session is not None:
            self.remote._call("stages_close", self.name)


def _protocol(options: IOSOptions) -> str:
    """What a stage's timing depends on, as `IOSOptions` fields (JSON)."""
    fields = asdict(options)
    return json.dumps({k: fields[k] for k in ("warmup", "repeat", "number", "cores")})


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m paragraph.tvm_interop.meter.remote --tracker HOST:PORT --key KEY``; returns
    the exit status: 0 when stopped with Ctrl+C (how a server is stopped), 2 after any error
    (one line on stderr; the traceback too with ``--debug``)."""
    parser = argparse.ArgumentParser(description="serve this device to paragraph clients "
                                     "through a TVM RPC tracker")
    parser.add_argument("--tracker", required=True, help="the tracker, HOST:PORT")
    parser.add_argument("--key", required=True, help="the device key clients ask for")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, default=9091, help="first port to try")
    parser.add_argument("--debug", action="store_true",
                        help="on an error, print the full traceback above the one-line message")
    args = parser.parse_args(argv)

    def command() -> int:
        server = serve(args.tracker, args.key, args.host, args.port)
        print(f"paragraph RPC server on port {server.port}, key {args.key!r}, tracker "
              f"{args.tracker}", flush=True)
        try:
            server.proc.join()
        except KeyboardInterrupt:
            server.terminate()
        return 0

    return exit_status(command, debug=args.debug, prog="paragraph-rpc-server")


if __name__ == "__main__":
    raise SystemExit(main())
