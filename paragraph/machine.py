"""What a benchmark result was measured on: machine, library versions, date."""

from __future__ import annotations

import ctypes
import datetime
import gc
import os
import platform
import time
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from paragraph.errors import ParagraphError
from paragraph.progress import Log
from paragraph.version import __version__

_PROCESS_CPUS: list[frozenset[int]] = []


# `PARAGRAPH_CPU_ISA=avx2` runs this machine as an AVX2-only CPU would run paragraph: no
# AVX-512 kernel of paragraph's own, oneDNN and MKL held to AVX2, TVM's kernels compiled for
# a Haswell (AVX2 + FMA); the cloud and client CPUs without AVX-512, tested and measured here
ISA_VARIABLE = "PARAGRAPH_CPU_ISA"
ISAS = ("native", "avx2")
AVX2_MCPU = "haswell"


def forced_isa() -> str:
    """The instruction set paragraph is held to: "native" (all this CPU has, the default) or
    "avx2" (`ISA_VARIABLE`). Anything else raises `ParagraphError` naming the choices."""
    value = os.environ.get(ISA_VARIABLE, "").strip().lower() or "native"
    if value not in ISAS:
        raise ParagraphError(f"{ISA_VARIABLE}={value!r}: choose one of {', '.join(ISAS)}")
    return value


def hold_libraries_to_isa() -> None:
    """Under ``PARAGRAPH_CPU_ISA=avx2``, hold oneDNN and MKL to AVX2 too (read when they
    first run, so set before any kernel runs; a value the user set stands)."""
    if forced_isa() == "avx2":
        os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
        os.environ.setdefault("MKL_ENABLE_INSTRUCTIONS", "AVX2")


def process_cpus() -> frozenset[int]:
    """The CPUs this process may run on: the main thread's affinity mask (which respects
    ``taskset`` and container CPU sets) when first asked, at paragraph's import. Read once:
    a one-stream run binds its calling thread, the main thread too, to one core for the run
    (`paragraph.tvm_interop.runtime.threads.stream_teams`), and asked then the mask is that core."""
    if not _PROCESS_CPUS:
        try:
            _PROCESS_CPUS.append(frozenset(os.sched_getaffinity(os.getpid())))
        except AttributeError:  # not on Linux
            _PROCESS_CPUS.append(frozenset(range(os.cpu_count() or 1)))
    return _PROCESS_CPUS[0]


def cpu_count() -> int:
    """How many CPUs this process may run on (see `process_cpus`)."""
    return len(process_cpus())


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cpu_id() -> str | None:
    """Vendor, family, model and stepping from /proc/cpuinfo: "AMD EPYC" names several
    generations whose kernels time differently (family 26 is Zen 5)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        return None
    if "vendor_id" not in fields:
        return None
    return (f"{fields['vendor_id']} family {fields.get('cpu family', '?')} model "
            f"{fields.get('model', '?')} stepping {fields.get('stepping', '?')}")


def cpu_flags() -> frozenset[str] | None:
    """This CPU's feature flags as /proc/cpuinfo names them (``avx2``, ``avx512f``, ...);
    None where they cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def has_avx512() -> bool | None:
    """Whether this CPU has AVX-512F (paragraph's own C++ kernels need it), from
    /proc/cpuinfo's flags; None where they cannot be read. Two VMs both named "AMD EPYC"
    were a Zen 4 with it and a Zen 3 without."""
    flags = cpu_flags()
    return None if flags is None else "avx512f" in flags


# the instruction-set flags compiled code may use: an artifact records those of the machine
# that wrote it (less AVX-512 under the AVX2 switch), and a machine lacking one refuses it
SIMD_FLAG_PREFIXES = ("sse", "ssse3", "avx", "fma", "f16c", "bmi", "amx", "vaes", "vpclmul",
                      "gfni", "movbe", "popcnt", "lzcnt", "abm")


# what `AVX2_MCPU` (Haswell) has: code compiled under the AVX2 switch uses no more
AVX2_FLAGS = frozenset({"sse", "sse2", "sse3", "ssse3", "sse4_1", "sse4_2", "avx", "avx2",
                        "fma", "f16c", "bmi1", "bmi2", "movbe", "popcnt", "abm"})


def simd_flags() -> list[str]:
    """The instruction-set flags (`SIMD_FLAG_PREFIXES`) of this CPU that paragraph's compiled
    code may use: all of them, or under ``PARAGRAPH_CPU_ISA=avx2`` those of `AVX2_FLAGS`;
    empty where /proc/cpuinfo cannot be read."""
    flags = cpu_flags() or frozenset()
    if forced_isa() == "avx2":
        flags = flags & AVX2_FLAGS
    return sorted(f for f in flags if f.startswith(SIMD_FLAG_PREFIXES))


def same_machine(recorded: Mapping[str, Any]) -> str | None:
    """Why ``recorded`` (a results file's `describe_machine`) is not this kind of machine
    (another CPU id, core count or AVX-512), or None where nothing recorded differs."""
    now = {"cpu_id": _cpu_id(), "cores": cpu_count(), "avx512": has_avx512()}
    differ = [f"{k} {recorded[k]!r} there, {v!r} here" for k, v in now.items()
              if recorded.get(k) is not None and v is not None and recorded[k] != v]
    return "; ".join(differ) or None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def describe_machine() -> dict[str, Any]:
    """CPU, core count, OS, Python and the versions of paragraph, TVM and friends, plus the date.

    Every JSON result under ``benchmarks/results/`` carries this, so numbers can be compared
    only where they were taken on the same kind of machine.
    """
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "cpu_id": _cpu_id(),
        "cores": cpu_count(),
        "avx512": has_avx512(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            "paragraph": __version__,
            "apache-tvm": _version("apache-tvm"),
            "apache-tvm-ffi": _version("apache-tvm-ffi"),
            "numpy": _version("numpy"),
            "torch": _version("torch"),
            "onnxruntime": _version("onnxruntime"),
        },
    }


def _ticks() -> tuple[int, int]:
    """CPU ticks that other processes used (all processes' user, nice and system time from
    ``/proc/stat``, less this process's from ``/proc/self/stat``) and steal ticks. Two reads:
    summing ``/proc/PID/stat`` over every process took 1-7 ms a reading, and IOS's stage
    measurement takes a reading around every stage it times."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = f.readline().split()
    with open("/proc/self/stat", encoding="ascii") as f:
        own = f.read().rsplit(")", 1)[1].split()
    busy = int(fields[1]) + int(fields[2]) + int(fields[3])  # user, nice, system
    steal = int(fields[8]) if len(fields) > 8 else 0
    return max(0, busy - int(own[11]) - int(own[12])), steal  # own utime, stime


Reading = tuple[int, int, float]  # other processes' CPU ticks, steal ticks, monotonic time


def _reading() -> Reading:
    other, steal = _ticks()
    return other, steal, time.monotonic()


def _contention(start: Reading, end: Reading, stray: int = 0) -> dict[str, float]:
    """Cores other processes used and steal took between two readings, per core-second of
    wall time; ``stray`` ticks or fewer count as none (a short window's rounding)."""
    wall = max(end[2] - start[2], 1e-9) * os.sysconf("SC_CLK_TCK")
    other, steal = end[0] - start[0], end[1] - start[1]
    return {"other_processes": round(other / wall, 3) if other > stray else 0.0,
            "steal": round(steal / wall, 3) if steal > stray else 0.0}


def cpu_contention(seconds: float = 1.0) -> dict[str, float]:
    """Cores other processes used (``other_processes``) and the hypervisor took from this VM
    (``steal``) over ``seconds`` while this process waits: what a benchmark records before and
    after timing, since the load average cannot tell its own threads from anyone else's.
    Empty where /proc is not available."""
    try:
        start = _reading()
        time.sleep(seconds)
        return _contention(start, _reading())
    except (OSError, ValueError):
        return {}


# cores used by other processes (or stolen by the hypervisor) that make a timing suspect
CONTENDED = 0.3


def available_memory() -> int | None:
    """Bytes of memory available to new allocations now (Linux's ``MemAvailable``), or None
    where that cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


# the memory limit of this process's control group (v2, then v1): in a container it is what
# the OOM killer enforces, whatever the machine has
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def total_memory() -> int | None:
    """Bytes of memory this process may use in all: the machine's physical memory, or its
    control group's limit where that is lower; None where neither can be read."""
    try:
        total: int | None = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        total = None
    for path in _CGROUP_LIMITS:
        try:
            with open(path) as f:
                limit = int(f.read().strip())  # "max" (no limit) is not a number
        except (OSError, ValueError):
            continue
        total = limit if total is None else min(total, limit)
        break
    return total


def release_memory() -> None:
    """Collect unreachable objects (TVM objects in reference cycles hold their tensors) and
    hand the freed heap back to the system (glibc's ``malloc_trim``), so that
    `available_memory` counts it: after a batch of BERT candidates was freed the process still
    held 21 GB of free heap, and the next batches were sized as if it were in use."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def wait_for_quiet_cores(log: Log, wait_s: float = 120.0) -> dict[str, float]:
    """The contention (`cpu_contention` over 2 s) once other processes leave the cores free,
    waiting up to ``wait_s`` and saying so through ``log``; the last sample either way."""
    deadline = time.monotonic() + wait_s
    while True:
        c = cpu_contention(2.0)
        if not is_contended(c) or time.monotonic() > deadline:
            return c
        log(f"  waiting for the cores to be free: {c}")


class LoadWatch:
    """Whether another process (or the hypervisor) held a core while this process measured:
    `cpu_contention`'s reading taken over the ``with`` block itself, without waiting. A cost
    measured under contention is used but not cached: a cached time outlives the moment, and
    one schedule choice made while a test suite ran beside stayed the planner's choice.

    The kernel counts CPU time in ticks (10 ms), so a block shorter than ``min_s`` is watched
    on, sleeping, until ``min_s`` has passed: a shorter window cannot tell a process that
    held a core throughout from a stray tick. Blocks under a tick with ``min_s`` 0 count as
    quiet."""

    def __init__(self, min_s: float = 0.05) -> None:
        self.min_s = min_s
        self.sample: dict[str, float] = {}  # `cpu_contention`'s keys, after the block
        self._start: Reading | None = None

    def __enter__(self) -> LoadWatch:
        self.sample = {}
        try:
            self._start = _reading()
        except (OSError, ValueError):
            self._start = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._start is None:
            return
        rest = self.min_s - (time.monotonic() - self._start[2])
        if rest > 0:
            time.sleep(rest)
        try:  # a tick is 10 ms: in a short block one stray tick is not contention
            self.sample = _contention(self._start, _reading(), stray=1)
        except (OSError, ValueError):
            return

    @property
    def contended(self) -> bool:
        """The block ran while another process held a core (never, with the environment's
        ``PARAGRAPH_CACHE_UNDER_LOAD=1``: a test suite that asserts caching on a shared
        machine sets it)."""
        if os.environ.get("PARAGRAPH_CACHE_UNDER_LOAD") == "1":
            return False
        return is_contended(self.sample)


def is_contended(*samples: dict[str, float]) -> bool:
    """Whether any `cpu_contention` sample shows another process (or steal) on a core."""
    return any(v > CONTENDED for c in samples for v in c.values())
