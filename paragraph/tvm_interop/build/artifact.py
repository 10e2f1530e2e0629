"""Writing the one-file artifact (its format and reading: `paragraph.tvm_interop.runtime.artifact`)
and what TVM's compiler adds when one is read (`compiler_parts`, `read_artifact`): the target,
checked against this CPU's name, the lowered module and the TVM VM's executable."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

from paragraph.files import atomic_write
from paragraph.graph import TensorRef
from paragraph.machine import describe_machine, simd_flags
from paragraph.rules.library import default_library
from paragraph.schedule import Schedule
from paragraph.tvm_interop.build.program import program_info, vm_executable, with_program_info
from paragraph.tvm_interop.build.weights import lifted, restored, stripped
from paragraph.tvm_interop.runtime.artifact import (
    FORMAT,
    LOWERED,
    MANIFEST,
    PROGRAM,
    SIGNATURE,
    VERSION,
    WEIGHTS,
    Artifact,
    ArtifactError,
    CompilerParts,
    artifact_key,
    bytes_of,
    graph_to_json,
    memory_to_json,
    signature_mac,
)
from paragraph.tvm_interop.runtime.artifact import read_artifact as read_with
from paragraph.tvm_interop.runtime.library import native
from paragraph.tvm_interop.runtime.memory import MemoryPlan, check_memory_plan
from paragraph.tvm_interop.runtime.program import KernelProgram
from paragraph.tvm_interop.runtime.target import is_gpu, local_cpu_target
from paragraph.version import __version__


# ---------------------------------------------------------------------------- write
def _signature(program: KernelProgram) -> dict[str, list[dict[str, Any]]]:
    graph = program.graph

    def entry(ref: TensorRef, name: str) -> dict[str, Any]:
        t = graph.type_of(ref)
        return {"name": name, "shape": list(t.shape), "dtype": t.dtype}

    return {"inputs": [entry(graph[i].out, graph[i].name) for i in graph.inputs],
            "outputs": [entry(r, f"output{i}") for i, r in enumerate(graph.outputs)]}


def _rules(rewrites: tuple[str, ...]) -> list[dict[str, str]]:
    """Each library rule applied, with the content hash of its library entry."""
    lib = default_library()
    return [{"id": r, "hash": lib.hashes.get(r.rstrip("~"), "")} for r in rewrites]


def write_artifact(path: str | os.PathLike, program: KernelProgram, schedule: Schedule,
                   memory: MemoryPlan, info: Mapping[str, Any] | None = None, *,
                   key: bytes | None = None) -> Path:
    """Write ``program`` under ``schedule`` with ``memory`` as one file at ``path``
    (atomically: an interrupted write leaves the old file or none). ``info`` (JSON values:
    the model's name, the search and schedule reports) goes into the manifest. With a key
    (``key``, else ``$PARAGRAPH_ARTIFACT_KEY``'s file: `artifact_key`) the manifest is signed
    (module docstring)."""
    key = artifact_key(key)
    schedule.validate(program.graph)
    check_memory_plan(program.graph, schedule, memory)
    lowered = with_program_info(program)
    bare, weights = stripped(lowered)
    weightless, lifted_weights = lifted(lowered)
    if len(lifted_weights) != len(weights) or not all(
            a.same_as(b) for a, b in zip(weights, lifted_weights, strict=True)):
        raise ArtifactError("internal error: the stripped and lifted weights differ")
    with tempfile.TemporaryDirectory(prefix="paragraph-artifact-") as tmp:
        lib = Path(tmp) / "kernels.so"
        vm_executable(weightless, program.target).get().export_library(str(lib))
        arrays = [np.from_dlpack(w) for w in weights]
        members = {
            "kernels.so": lib.read_bytes(),
            PROGRAM: json.dumps(graph_to_json(program.graph, arrays)).encode(),
            LOWERED: tvm.ir.save_json(bare).encode(),
            "schedule.json": schedule.dumps().encode(),
            "memory.json": json.dumps(memory_to_json(memory)).encode(),
        }
    sums = {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
            for name, data in members.items()}
    total = sum(len(bytes_of(w)) for w in weights)

    def write(f: Any) -> None:
        with zipfile.ZipFile(f, "w") as z:
            digest = hashlib.sha256()
            with z.open(zipfile.ZipInfo(WEIGHTS), "w", force_zip64=total >= 2**31) as out:
                for w in weights:  # the tensors' own bytes (DLPack), no copy
                    data = bytes_of(w)
                    digest.update(data)
                    out.write(data)
            sums[WEIGHTS] = {"sha256": digest.hexdigest(), "bytes": total}
            for name, data in members.items():  # the library stored as is; JSON compressed
                z.writestr(name, data, compress_type=zipfile.ZIP_STORED
                           if name.endswith(".so") else zipfile.ZIP_DEFLATED)
            manifest_bytes = _manifest(program, schedule, memory, info, weights, sums)
            z.writestr(MANIFEST, manifest_bytes, compress_type=zipfile.ZIP_DEFLATED)
            if key is not None:
                z.writestr(SIGNATURE, json.dumps({"algorithm": "hmac-sha256",
                                                  "mac": signature_mac(key, manifest_bytes)}))

    atomic_write(path, write)
    return Path(path)


def _manifest(program: KernelProgram, schedule: Schedule, memory: MemoryPlan,
              info: Mapping[str, Any] | None, weights: list[tvm.runtime.Tensor],
              sums: dict[str, dict[str, Any]]) -> bytes:
    manifest = {
        "format": FORMAT, "version": VERSION,
        "paragraph": __version__, "tvm": tvm.__version__,
        "target": json.loads(str(program.target)),
        "device": "cuda" if is_gpu(program.target) else "cpu",
        "machine": describe_machine(),
        # what a runtime-only reader checks this CPU against (`runtime.artifact._device`)
        "cpu_flags": [] if is_gpu(program.target) else simd_flags(),
        "kernels": program.kernel_source, "sources": program.sources(),
        "rules": _rules(program.rewrites),
        "schedule": {"name": schedule.name, "summary": schedule.describe()},
        "memory": {"blocks": len(memory.blocks), "bytes": memory.peak_bytes},
        **_signature(program),
        "program": program_info(program),
        "info": dict(info or {}),
        "weights": [{"dtype": str(w.dtype), "shape": [int(d) for d in w.shape]}
                    for w in weights],
        # the C++ kernels' forms chosen by timing in this process (this program's among
        # them): a loaded program's kernels start with them (`_chosen_forms`)
        "forms": native.chosen_forms() if program.sources().get("vendor") else {},
        "members": sums,
    }
    return json.dumps(manifest, indent=1, default=str).encode()


# ---------------------------------------------------------------------------- read
def _target(manifest: Mapping[str, Any], device: tvm.runtime.Device,
            what: str) -> tvm.target.Target:
    """The manifest's target; for a CPU, refused unless this CPU has its name (TVM's code
    may use any instruction of the CPU it was compiled for)."""
    try:
        target = tvm.target.Target(manifest["target"])
    except Exception as e:  # noqa: BLE001 - TVM raises its own error types for bad targets
        raise ArtifactError(f"{what}: unreadable target in the manifest ({e})") from None
    if not is_gpu(target):
        want = str(target.attrs.get("mcpu", ""))
        here = str(local_cpu_target().attrs.get("mcpu", ""))
        if want and want != here:
            raise ArtifactError(f"{what} was compiled for the CPU {want!r} "
                                f"({manifest.get('machine', {}).get('cpu', '?')}); this "
                                f"machine's is {here or 'unknown'!r}, which may lack its "
                                "instructions: compile the model on (or for) this machine")
    return target


def _lowered(data: bytes, weights: Sequence[tvm.runtime.Tensor]) -> tvm.IRModule:
    return restored(tvm.ir.load_json(data.decode()), weights)


COMPILER = CompilerParts(_target, _lowered, relax.VMExecutable)


def read_artifact(path: str | os.PathLike, device: tvm.runtime.Device | None = None, *,
                  key: bytes | None = None) -> Artifact:
    """`paragraph.tvm_interop.runtime.artifact.read_artifact` with TVM's compiler: the
    program also has its target (this CPU's name checked against it), its lowered module
    (read on first use) and the TVM VM."""
    return read_with(path, device, key=key, compiler=COMPILER)
