"""What a benchmark result was measured on: machine, library versions, date."""

from __future__ import annotations

import datetime
import os
import platform
from importlib import metadata


def cpu_count() -> int:
    """CPUs this process may run on (respects affinity masks and container CPU sets)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def describe_machine() -> dict:
    """CPU, core count, OS, Python and the versions of paragraph, TVM and friends, plus the date.

    Every JSON result under ``benchmarks/results/`` carries this, so numbers can be compared
    only where they were taken on the same kind of machine.
    """
    import paragraph

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "cores": cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            "paragraph": paragraph.__version__,
            "apache-tvm": _version("apache-tvm"),
            "apache-tvm-ffi": _version("apache-tvm-ffi"),
            "numpy": _version("numpy"),
            "torch": _version("torch"),
            "onnxruntime": _version("onnxruntime"),
        },
    }
