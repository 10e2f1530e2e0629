"""The one-file artifact: a compiled program, its schedule and memory plan, and a manifest.

A zip archive (nothing in it is pickled) of

* ``manifest.json``: format and version, the paragraph and TVM versions that wrote it, target,
  machine, kernel sources, library rules applied (with their content hashes), the search and
  schedule reports, the model's inputs and outputs, and a SHA-256 of every other member;
* ``kernels.so``: every kernel and the VM code (``relax.VMExecutable.export_library``);
* ``lowered.json``: the lowered module with its weights and `program_info` on ``main``, from
  which the kernel graph is rebuilt (``tvm.ir.save_json``);
* ``schedule.json`` (`paragraph.schedule.Schedule`) and ``memory.json`` (the block of every
  tensor, `MemoryPlan`).

`read_artifact` refuses, with an `ArtifactError` naming the cause, a file that is not an
artifact, a truncated or altered one (checksums are checked before the library is loaded), one
written by another format version or another TVM, and one compiled for another CPU or a GPU
this machine lacks. The schedule is checked against the rebuilt kernel graph and the memory
plan against the schedule (`check_memory_plan`), so a loaded program runs as it was compiled.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import threading
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm
from tvm import relax

from paragraph.errors import ParagraphError
from paragraph.files import atomic_write_bytes
from paragraph.graph import TensorRef
from paragraph.machine import describe_machine
from paragraph.rules.library import default_library
from paragraph.schedule import Schedule, ScheduleError
from paragraph.tvm_interop.build.program import (
    program_from_lowered,
    program_info,
    with_program_info,
)
from paragraph.tvm_interop.runtime.memory import Block, MemoryPlan, check_memory_plan
from paragraph.tvm_interop.runtime.program import KernelProgram
from paragraph.tvm_interop.runtime.target import default_device, is_gpu, local_cpu_target
from paragraph.version import __version__

FORMAT, VERSION = "paragraph-artifact", 1
MANIFEST = "manifest.json"
MEMBERS = ("kernels.so", "lowered.json", "schedule.json", "memory.json")


class ArtifactError(ParagraphError):
    """A file is not a paragraph artifact, or one this paragraph/TVM/machine cannot run."""


@dataclass(frozen=True)
class Artifact:
    """What `read_artifact` returns: the linked program, its schedule and memory plan, and
    the manifest."""

    program: KernelProgram
    schedule: Schedule
    memory: MemoryPlan
    manifest: Mapping[str, Any]


# ---------------------------------------------------------------------------- memory plan JSON
def memory_to_json(plan: MemoryPlan) -> dict[str, Any]:
    """A memory plan as JSON values: block sizes (and which are dedicated to outputs) and the
    block of every kernel output and view, as ``"node:index"``."""
    return {"blocks": [[b.size, b.dedicated] for b in plan.blocks],
            "block_of": {f"{r.node}:{r.index}": b for r, b in sorted(
                plan.block_of.items(), key=lambda item: (item[0].node, item[0].index))},
            "no_reuse_bytes": plan.no_reuse_bytes}


def memory_from_json(data: Mapping[str, Any]) -> MemoryPlan:
    """`memory_to_json` read back (users and tensors of each block are rebuilt from it)."""
    blocks = [Block(int(size), bool(dedicated)) for size, dedicated in data["blocks"]]
    block_of = {}
    for key, b in data["block_of"].items():
        node, _, index = str(key).partition(":")
        ref = TensorRef(int(node), int(index))
        block_of[ref] = int(b)
        blocks[int(b)].tensors.append(ref)
    return MemoryPlan(blocks, block_of, int(data["no_reuse_bytes"]))


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
                   memory: MemoryPlan, info: Mapping[str, Any] | None = None) -> Path:
    """Write ``program`` under ``schedule`` with ``memory`` as one file at ``path``
    (atomically: an interrupted write leaves the old file or none). ``info`` (JSON values:
    the model's name, the search and schedule reports) goes into the manifest."""
    schedule.validate(program.graph)
    check_memory_plan(program.graph, schedule, memory)
    with tempfile.TemporaryDirectory(prefix="paragraph-artifact-") as tmp:
        lib = Path(tmp) / "kernels.so"
        program.executable.export_library(str(lib))
        members = {
            "kernels.so": lib.read_bytes(),
            "lowered.json": tvm.ir.save_json(with_program_info(program)).encode(),
            "schedule.json": schedule.dumps().encode(),
            "memory.json": json.dumps(memory_to_json(memory)).encode(),
        }
    manifest = {
        "format": FORMAT, "version": VERSION,
        "paragraph": __version__, "tvm": tvm.__version__,
        "target": json.loads(str(program.target)),
        "device": "cuda" if is_gpu(program.target) else "cpu",
        "machine": describe_machine(),
        "kernels": program.kernel_source, "sources": program.sources(),
        "rules": _rules(program.rewrites),
        "schedule": {"name": schedule.name, "summary": schedule.describe()},
        "memory": {"blocks": len(memory.blocks), "bytes": memory.peak_bytes},
        **_signature(program),
        "program": program_info(program),
        "info": dict(info or {}),
        "members": {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
                    for name, data in members.items()},
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr(MANIFEST, json.dumps(manifest, indent=1, default=str),
                   compress_type=zipfile.ZIP_DEFLATED)
        for name, data in members.items():  # the library stored as is; JSON compressed
            z.writestr(name, data, compress_type=zipfile.ZIP_STORED if name.endswith(".so")
                       else zipfile.ZIP_DEFLATED)
    atomic_write_bytes(path, buffer.getvalue())
    return Path(path)


# ---------------------------------------------------------------------------- read
def is_artifact(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a file that looks like an artifact (a zip holding a manifest)."""
    p = Path(path)
    if not p.is_file():
        return False
    try:
        with zipfile.ZipFile(p) as z:
            return MANIFEST in z.namelist()
    except (zipfile.BadZipFile, OSError):
        return False


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest of the artifact at ``path``, checked for format, version and TVM."""
    return _open(Path(path))[0]


def _open(path: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    what = f"{path}"
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            if MANIFEST not in names:
                raise ArtifactError(f"{what} is not a paragraph artifact (no {MANIFEST})")
            manifest = json.loads(z.read(MANIFEST))
            _check_manifest(manifest, what)
            members = {}
            for name in MEMBERS:
                if name not in names:
                    raise ArtifactError(f"{what} is incomplete: {name} is missing")
                members[name] = z.read(name)
    except FileNotFoundError:
        raise ArtifactError(f"{what}: no such file") from None
    except IsADirectoryError:
        raise ArtifactError(f"{what} is a directory, not a paragraph artifact") from None
    except zipfile.BadZipFile as e:
        raise ArtifactError(f"{what} is not a paragraph artifact, or it is truncated or "
                            f"damaged ({e})") from None
    except (OSError, ValueError, zipfile.LargeZipFile) as e:  # CRC errors are ValueErrors too
        raise ArtifactError(f"{what} cannot be read: {type(e).__name__}: {e}") from None
    for name, data in members.items():
        want = manifest["members"].get(name, {}).get("sha256")
        if hashlib.sha256(data).hexdigest() != want:
            raise ArtifactError(f"{what} is corrupt: {name} does not match its checksum in the "
                                "manifest (the file was altered after it was written)")
    return manifest, members


def _check_manifest(manifest: Any, what: str) -> None:
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{what} is not a paragraph artifact (its manifest's format is "
                            f"{manifest.get('format') if isinstance(manifest, dict) else None!r})")
    if manifest.get("version") != VERSION:
        raise ArtifactError(f"{what} is a version {manifest.get('version')!r} artifact "
                            f"(paragraph {manifest.get('paragraph')}); this paragraph "
                            f"({__version__}) reads version {VERSION}: compile the model again")
    if manifest.get("tvm") != tvm.__version__:
        raise ArtifactError(f"{what} was compiled with TVM {manifest.get('tvm')}; this is TVM "
                            f"{tvm.__version__}, whose runtime may not load its kernels: "
                            "compile the model again")
    if not isinstance(manifest.get("members"), dict):
        raise ArtifactError(f"{what}: the manifest lists no members")


def _check_device(manifest: Mapping[str, Any], target: tvm.target.Target,
                  device: tvm.runtime.Device, what: str) -> None:
    if is_gpu(target):
        if not device.exist:
            raise ArtifactError(f"{what} was compiled for {target.kind.name} "
                                f"{target.attrs.get('arch', '')}, and there is no such device "
                                "here")
        return
    want = str(target.attrs.get("mcpu", ""))
    here = str(local_cpu_target().attrs.get("mcpu", ""))
    if want and want != here:
        raise ArtifactError(f"{what} was compiled for the CPU {want!r} "
                            f"({manifest.get('machine', {}).get('cpu', '?')}); this machine's "
                            f"is {here or 'unknown'!r}, which may lack its instructions: "
                            "compile the model on (or for) this machine")


def read_artifact(path: str | os.PathLike,
                  device: tvm.runtime.Device | None = None) -> Artifact:
    """Load the artifact at ``path``: checked (see the module docstring), its library loaded,
    its program linked on ``device`` (the target's default when None), ready to run."""
    path = Path(path)
    manifest, members = _open(path)
    what = str(path)
    try:
        target = tvm.target.Target(manifest["target"])
    except Exception as e:  # noqa: BLE001 - TVM raises its own error types for bad targets
        raise ArtifactError(f"{what}: unreadable target in the manifest ({e})") from None
    device = device or default_device(target)
    _check_device(manifest, target, device, what)
    library = _load_library(members["kernels.so"], what)
    try:
        lowered = tvm.ir.load_json(members["lowered.json"].decode())
        program = program_from_lowered(lowered, target, device=device,
                                       executable=relax.VMExecutable(library))
        schedule = Schedule.from_json(members["schedule.json"].decode(), program.graph)
        memory = memory_from_json(json.loads(members["memory.json"]))
        _check_memory(program, schedule, memory)
    except ScheduleError as e:
        raise ArtifactError(f"{what}: its schedule or memory plan does not fit its program "
                            f"({e})") from None
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise ArtifactError(f"{what}: unreadable program ({type(e).__name__}: {e})") from None
    return Artifact(program, schedule, memory, manifest)


# kernel libraries loaded in this process, by the SHA-256 of their bytes: TVM never unloads a
# library it opened (each load of one artifact kept 0.6 MiB more: 1,000 loads of a reduced
# SqueezeNet grew the process by 600 MiB), and the same bytes are the same code
_LIBRARIES: dict[str, tvm.runtime.Module] = {}
_LIBRARIES_LOCK = threading.Lock()


def _load_library(data: bytes, what: str) -> tvm.runtime.Module:
    """The kernel library ``data`` loaded (once per process for the same bytes)."""
    key = hashlib.sha256(data).hexdigest()
    with _LIBRARIES_LOCK:
        if key in _LIBRARIES:
            return _LIBRARIES[key]
        with tempfile.TemporaryDirectory(prefix="paragraph-artifact-") as tmp:
            lib_path = Path(tmp) / "kernels.so"
            lib_path.write_bytes(data)
            try:
                library = tvm.runtime.load_module(str(lib_path))
            except Exception as e:  # noqa: BLE001 - a library that does not load
                raise ArtifactError(f"{what}: its kernel library does not load here ({e})"
                                    ) from None
        _LIBRARIES[key] = library
        return library


def _check_memory(program: KernelProgram, schedule: Schedule, memory: MemoryPlan) -> None:
    """The plan has a block for every kernel output, and (`check_memory_plan`) big enough
    blocks, none shared by two tensors that may be live at once."""
    graph = program.graph
    for n in graph.nodes:
        if n.kind == "kernel":
            for i in range(len(n.outputs)):
                if TensorRef(n.id, i) not in memory.block_of:
                    raise ScheduleError(f"the memory plan has no block for {TensorRef(n.id, i)}")
    check_memory_plan(graph, schedule, memory)
