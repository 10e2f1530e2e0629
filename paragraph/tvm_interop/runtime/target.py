"""Targets and devices: what `tvm.target.Target` a user's words mean (`resolve_target`), the one
CPU/GPU test (`is_cpu`, `is_gpu`) and the device a program runs on (`default_device`)."""

from __future__ import annotations

import json
from typing import Any

import tvm

from paragraph.errors import ParagraphError
from paragraph.machine import AVX2_MCPU, cpu_count, forced_isa

# a GPU target that compiles here without a GPU (nvcc is present); H100/H200 are sm_90
CUDA_COMPILE_ONLY = {"kind": "cuda", "arch": "sm_90", "max_shared_memory_per_block": 49152,
                     "max_threads_per_block": 1024}
GPU_KINDS = ("cuda", "rocm", "vulkan", "metal", "opencl")


def local_cpu_target(num_cores: int | None = None) -> tvm.target.Target:
    """An LLVM target for this machine's CPU (its own ``mcpu``, all its cores by default).

    Uses the JSON-dict form: MetaSchedule refuses string targets in TVM 0.27.
    """
    spec: dict[str, Any] = {"kind": "llvm", "num-cores": num_cores or cpu_count()}
    cpu = tvm.target.codegen.llvm_get_system_cpu()
    if forced_isa() == "avx2":  # PARAGRAPH_CPU_ISA=avx2: as an AVX2-only CPU compiles
        cpu = AVX2_MCPU
    if cpu and tvm.target.codegen.llvm_is_valid_cpu(cpu, ""):
        spec["mcpu"] = cpu
    return tvm.target.Target(spec)


def resolve_target(target: tvm.target.Target | str | dict | None) -> tvm.target.Target:
    """What ``target`` means, as `tvm.target.Target` takes it: ``None``/"cpu"/"llvm" -> this
    machine's CPU (its ``mcpu``, every core); "cuda"/"gpu" -> the visible GPU (or sm_90 for
    compiling without one); a Target as it is; a dict or its JSON text (``{"kind": "llvm",
    "mcpu": "znver4"}``), a target kind or a tag (``nvidia/nvidia-h100``) through
    ``tvm.target.Target``. `ParagraphError` names what TVM refused."""
    if target is None or target in ("cpu", "llvm"):
        return local_cpu_target()
    if target in ("cuda", "gpu"):
        dev = tvm.cuda(0)
        if dev.exist:
            return tvm.target.Target.from_device(dev)
        return tvm.target.Target(CUDA_COMPILE_ONLY)
    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, str) and target.lstrip().startswith("{"):
        try:
            target = json.loads(target)
        except ValueError as e:
            raise ParagraphError(f"target {target!r} is not valid JSON: {e}") from None
    try:
        return tvm.target.Target(target)
    except Exception as e:  # noqa: BLE001 - TVM raises several kinds for a bad target
        hint = ""
        if isinstance(target, str) and " -" in target:
            hint = (" (TVM 0.27 takes no 'kind -option=value' strings: give the JSON form, "
                    "e.g. '{\"kind\": \"llvm\", \"mcpu\": \"znver4\"}')")
        raise ParagraphError(f"not a target TVM knows: {target!r}{hint}: "
                             f"{str(e).strip().splitlines()[-1] if str(e).strip() else e}"
                             ) from None


def is_gpu(target: tvm.target.Target) -> bool:
    """Whether ``target`` is a GPU (its kernels launch on streams)."""
    return target.kind.name in GPU_KINDS


def is_cpu(target: tvm.target.Target) -> bool:
    """Whether ``target`` is a CPU (LLVM): kernels run on worker threads."""
    return target.kind.name == "llvm"


def default_device(target: tvm.target.Target) -> tvm.runtime.Device:
    """The device a program for ``target`` runs on unless told otherwise: GPU 0, or the CPU."""
    return tvm.cuda(0) if is_gpu(target) else tvm.cpu(0)


def runs_here(target: tvm.target.Target) -> bool:
    """Whether programs for ``target`` run on this machine, so that they can be measured and
    given vendor kernels here: a CPU target of this architecture (and this ``mcpu``, where it
    names one), or CUDA with a visible GPU."""
    if is_gpu(target):
        return target.kind.name == "cuda" and bool(tvm.cuda(0).exist)
    if not is_cpu(target):
        return False
    triple = target.attrs.get("mtriple")
    here = tvm.target.codegen.llvm_get_system_triple()
    if triple and str(triple).split("-")[0] != str(here).split("-")[0]:
        return False
    mcpu = target.attrs.get("mcpu")
    if forced_isa() == "avx2" and str(mcpu) == AVX2_MCPU:  # this CPU runs a Haswell's code
        return True  # (the switch's builds measured and given vendor kernels, as on one)
    return not mcpu or str(mcpu) == tvm.target.codegen.llvm_get_system_cpu()


def describe_target(target: tvm.target.Target) -> str:
    """A target in a few words: its tag, or its kind with its ``mcpu``/``arch``/``mtriple``."""
    tag = str(target.attrs.get("tag", "") or getattr(target, "tag", "") or "")
    if tag:
        return tag
    detail = [str(target.attrs[k]) for k in ("mcpu", "arch", "mtriple") if target.attrs.get(k)]
    return " ".join([target.kind.name, *detail])
