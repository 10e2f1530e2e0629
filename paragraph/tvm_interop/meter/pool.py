"""Every device a TVM RPC tracker offers for a key, measuring at once (issue 54, item 7).

`connect` asks the tracker how many servers are free for the key and holds a session on each
(`paragraph.tvm_interop.meter.remote.Remote`); a `RemotePool` is a `Meter` over them, so the
planner and the search measure through it as through one device. TVM's RPC is the distributed
engine; the pool only deals work out:

* ``runs``: the first candidate (the best graph so far, in the on-board loop) is the yardstick.
  The others are dealt round-robin to the devices, each device times the yardstick beside its
  share, side by side as one device does, and a candidate's time is its ratio to the yardstick
  on its own device times the yardstick's time on the first device (AutoGraph's measured
  candidates are compared with the current best: the ratio is what the loop decides on, and a
  ratio taken on one device is free of the differences between devices).
* ``kernel_times`` (the search's kernel signatures, critical-path's kernel costs): each call on
  whichever device is free, so callers that measure from several threads
  (`paragraph.tvm_interop.meter.signatures.SignatureMeter`) keep every device busy.
* IOS's stage timers hold one device until closed; the rest (hand-off, peaks) go to the first.

The devices must be alike (one target, one core count): a key names a kind of device.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

import tvm
from tvm import rpc

from paragraph.errors import ParagraphError
from paragraph.passes.ios import IOSOptions
from paragraph.progress import Log
from paragraph.schedule import Schedule
from paragraph.tvm_interop.measure.costdb import CostDB
from paragraph.tvm_interop.measure.device import Peaks
from paragraph.tvm_interop.meter.protocol import Groups
from paragraph.tvm_interop.meter.remote import Remote, parse_address
from paragraph.tvm_interop.runtime.program import KernelProgram

T = TypeVar("T")
Candidate = tuple[KernelProgram, Schedule]


def free_servers(address: str) -> int:
    """How many servers the tracker at ``address`` (``HOST:PORT:KEY``) has free for the key
    now (0 when it lists none: a session request then waits for one)."""
    host, port, key = parse_address(address)
    try:
        tracker = rpc.connect_tracker(host, port)
        try:
            info = tracker.summary()
        finally:
            tracker.close()
    except (RuntimeError, OSError):
        return 0  # `Remote` probes the tracker itself and says what is wrong
    return int(info.get("queue_info", {}).get(key, {}).get("free", 0))


def connect(address: str, timeout: float = 60.0) -> RemotePool:
    """Sessions on every server free for the key behind ``address``: the first waits up to
    ``timeout`` seconds as `Remote` does, the others are taken only if free now. Devices
    unlike the first (another target or core count) are given back."""
    first = Remote(address, timeout)
    devices = [first]
    for _ in range(free_servers(address)):
        try:
            other = Remote(address, timeout=3.0)
        except ParagraphError:
            break  # taken by another client meanwhile
        if str(other.target) != str(first.target) or other.cores != first.cores:
            other.close()
            continue
        devices.append(other)
    return RemotePool(devices)


class RemotePool:
    """A `Meter` over several alike remote devices (see the module docstring)."""

    def __init__(self, devices: Sequence[Remote]) -> None:
        if not devices:
            raise ParagraphError("a pool of remote devices needs at least one")
        self.devices = list(devices)
        first = self.devices[0]
        self.target = first.target
        self.cores = first.cores
        self.machine = first.machine
        self.address, self.key = first.address, first.key
        self.db: CostDB | None = None  # what the devices measure is not this machine's
        self.tuning = ""
        self._free: queue.Queue[Remote] = queue.Queue()
        for d in self.devices:
            self._free.put(d)

    @property
    def parallel(self) -> int:
        """How many measurements can run at once (one per device)."""
        return len(self.devices)

    @contextmanager
    def _device(self) -> Iterator[Remote]:
        """A free device, held for the block (a session serves one call at a time)."""
        device = self._free.get()
        try:
            yield device
        finally:
            self._free.put(device)

    def _on_each(self, jobs: Sequence[Callable[[Remote], T]]) -> list[T]:
        """``jobs[i]`` on a device of its own, all at once; results in order."""

        def run(job: Callable[[Remote], T]) -> T:
            with self._device() as d:
                return job(d)

        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            return list(pool.map(run, jobs))

    # -- the Meter protocol
    def runs(self, candidates: Sequence[Candidate], *, repeat: int = 6, warmup: int = 2,
             block: int = 5, check: bool = False, fresh: bool = False) -> list[float]:
        """Median seconds of each candidate, the first timed beside every share (module
        docstring); with ``check`` every device's outputs must agree with the first's."""
        n = min(len(self.devices), max(1, len(candidates) - 1))
        if n == 1:
            with self._device() as d:
                return d.runs(candidates, repeat=repeat, warmup=warmup, block=block,
                              check=check)
        shares = [list(range(1 + i, len(candidates), n)) for i in range(n)]

        def job(share: list[int]) -> Callable[[Remote], list[float]]:
            return lambda d: d.runs([candidates[0], *(candidates[j] for j in share)],
                                    repeat=repeat, warmup=warmup, block=block, check=check)

        timed = self._on_each([job(s) for s in shares])
        yardstick = timed[0][0]
        out = [yardstick] + [0.0] * (len(candidates) - 1)
        for share, seconds in zip(shares, timed, strict=True):
            for j, s in zip(share, seconds[1:], strict=True):
                out[j] = s / seconds[0] * yardstick
        return out

    def kernel_times(self, program: KernelProgram, threads: Sequence[int], *,
                     fill: bool = False, log: Log | None = None) -> list[dict[int, float]]:
        """Seconds per kernel of ``program`` on the first free device (`Remote.kernel_times`)."""
        with self._device() as d:
            return d.kernel_times(program, threads, fill=fill, log=log)

    def stage_timer(self, program: KernelProgram, options: IOSOptions,
                    seq_threads: int) -> PooledStages:
        """A timer of ``program``'s IOS stages on one device, held until it is closed."""
        device = self._free.get()
        try:
            return PooledStages(self, device, device.stage_timer(program, options, seq_threads))
        except BaseException:
            self._free.put(device)
            raise

    def sequence_seconds(self, program: KernelProgram, threads: int,
                         options: IOSOptions) -> float:
        with self._device() as d:
            return d.sequence_seconds(program, threads, options)

    def measures(self, target: tvm.target.Target) -> bool:
        return self.devices[0].measures(target)

    def handoff(self, target: tvm.target.Target | None = None) -> float:
        with self._device() as d:
            return d.handoff(target)

    def peaks(self, target: tvm.target.Target) -> Peaks:
        return self.devices[0].peaks(target)

    def describe(self) -> str:
        """One line: the devices behind the tracker."""
        one = self.devices[0].describe()
        return one if len(self.devices) == 1 else f"{len(self.devices)} x {one}"

    def close(self) -> None:
        """End every session (the servers take their next clients)."""
        for d in self.devices:
            d.close()

    def __enter__(self) -> RemotePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PooledStages:
    """A device's stage timer that gives the device back to its pool when closed."""

    def __init__(self, pool: RemotePool, device: Remote, timer: Any) -> None:
        self.pool, self.device, self.timer = pool, device, timer

    def measure(self, groups: Groups, strategy: str) -> float:
        return float(self.timer.measure(groups, strategy))

    def close(self) -> None:
        if self.device is None:
            return
        try:
            self.timer.close()
        finally:
            self.pool._free.put(self.device)  # noqa: SLF001 - the pool's own helper
            self.device = None  # type: ignore[assignment]
