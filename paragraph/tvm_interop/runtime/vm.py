"""The local CPU target, and a Relax module compiled by TVM's default pipeline and run on the TVM
VM (the baseline every paragraph program is checked against)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tvm
from tvm import relax

from paragraph.tvm_interop.runtime.target import local_cpu_target


def build_vm(mod: tvm.IRModule, target: tvm.target.Target | str | None = None,
             device: tvm.runtime.Device | None = None) -> relax.VirtualMachine:
    """``tvm.compile`` with the default pipeline, loaded into a VM on ``device`` (CPU)."""
    target = target or local_cpu_target()
    executable = tvm.compile(mod, target=target)
    return relax.VirtualMachine(executable, device or tvm.cpu())


def run_vm(vm: relax.VirtualMachine, inputs: Sequence[np.ndarray], func: str = "main",
           device: tvm.runtime.Device | None = None) -> list[np.ndarray]:
    """Run ``vm[func]`` on numpy inputs; returns the outputs (a tuple result is flattened)."""
    device = device or tvm.cpu()
    out = vm[func](*[tvm.runtime.tensor(a, device) for a in inputs])
    return flatten_result(out)


def flatten_result(out: Any) -> list[np.ndarray]:
    """A VM result (a tensor or nested tuples of them) as a flat list of numpy arrays."""
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [a for item in out for a in flatten_result(item)]
