"""The one-file artifact: a compiled program, its schedule and memory plan, and a manifest.

A zip archive (nothing in it is pickled) of

* ``manifest.json``: format and version, the paragraph and TVM versions that wrote it, target,
  machine, kernel sources, library rules applied (with their content hashes), the search and
  schedule reports, the model's inputs and outputs, and a SHA-256 of every other member;
* ``kernels.so``: every kernel and the VM code (``relax.VMExecutable.export_library``), whose
  ``main`` takes the weights after the inputs (`weights.lifted`);
* ``lowered.json``: the lowered module with `program_info` on ``main``, from which the kernel
  graph is rebuilt (``tvm.ir.save_json``), its weights replaced by placeholders
  (`weights.stripped`);
* ``weights.bin``: the weights, once, as raw bytes in the placeholders' order (their dtypes
  and shapes in the manifest), stored uncompressed and streamed: written from the program's
  tensors and read into the loaded program's, never held twice;
* ``schedule.json`` (`paragraph.schedule.Schedule`) and ``memory.json`` (the block of every
  tensor, `MemoryPlan`);
* ``signature.json``, only in a signed artifact: an HMAC-SHA256 of the manifest's bytes.

**An artifact is native code.** Loading one dlopens ``kernels.so``, which runs with the
loading process's rights: load only artifacts from a source you trust. The SHA-256 sums in
the manifest detect accidental damage only (whoever edits the file can recompute them). A
key the file does not carry makes the check real: written with ``key``, the manifest (which
holds every other member's sum) is signed; read with ``key`` (or ``$PARAGRAPH_ARTIFACT_KEY``,
the path of a key file: `artifact_key`), the signature is checked with
`hmac.compare_digest`, then every member against its signed sum, all before anything is
written to disk or loaded. Nothing outside the signed manifest and the members it sums is
read. An unsigned file, a wrong key and any altered byte are refused.

`read_artifact` refuses, with an `ArtifactError` naming the cause, a file that is not an
artifact, a truncated or altered one (checksums are checked before the library is loaded), one
written by another format version or another TVM, and one compiled for another CPU or a GPU
this machine lacks. The memory plan is checked as data (`memory_from_json`: block indices in
range, sizes non-negative) and against the rebuilt kernel graph (`check_memory_plan`: every
tensor fits its block, views lie inside their source, no block larger than what it holds,
no two live tensors share one), and the schedule against the graph, so a loaded program runs
as it was compiled and a doctored plan cannot make the executor write outside a buffer.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import tempfile
import threading
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

from paragraph.errors import ParagraphError
from paragraph.files import atomic_write
from paragraph.graph import TensorRef
from paragraph.machine import describe_machine
from paragraph.rules.library import default_library
from paragraph.schedule import Schedule, ScheduleError
from paragraph.tvm_interop.build.program import (
    program_from_lowered,
    program_info,
    vm_executable,
    with_program_info,
)
from paragraph.tvm_interop.build.weights import lifted, restored, stripped
from paragraph.tvm_interop.runtime.library import native
from paragraph.tvm_interop.runtime.memory import Block, MemoryPlan, check_memory_plan
from paragraph.tvm_interop.runtime.program import KernelProgram
from paragraph.tvm_interop.runtime.target import default_device, is_gpu, local_cpu_target
from paragraph.version import __version__

FORMAT, VERSION = "paragraph-artifact", 2  # 2: weights once, raw (weights.bin)
MANIFEST = "manifest.json"
MEMBERS = ("kernels.so", "lowered.json", "schedule.json", "memory.json")  # read whole
WEIGHTS = "weights.bin"  # streamed
SIGNATURE = "signature.json"  # {"algorithm": "hmac-sha256", "mac": hex}: of the manifest's bytes
KEY_ENV = "PARAGRAPH_ARTIFACT_KEY"  # the path of a key file
MIN_KEY_BYTES = 16  # HMAC's strength is its key's: refuse a password-sized one


class ArtifactError(ParagraphError):
    """A file is not a paragraph artifact, or one this paragraph/TVM/machine cannot run."""


# ---------------------------------------------------------------------------- keys
def read_key(path: str | os.PathLike) -> bytes:
    """The signing key in the file at ``path``: its bytes, a trailing line end removed (so
    that ``openssl rand -hex 32 > key`` makes one). `ArtifactError` when it cannot be read
    or is shorter than `MIN_KEY_BYTES`."""
    try:
        key = Path(path).read_bytes().rstrip(b"\r\n")
    except OSError as e:
        raise ArtifactError(f"key file {path}: cannot be read ({e.strerror or e})") from None
    return _checked_key(key, f"key file {path}")


def artifact_key(key: bytes | None = None, key_file: str | os.PathLike | None = None
                 ) -> bytes | None:
    """The key that signs and verifies artifacts: ``key``, else the key file ``key_file``,
    else the key file named by ``$PARAGRAPH_ARTIFACT_KEY``, else None (unsigned)."""
    if key is not None:
        return _checked_key(key, "the key")
    if key_file is not None:
        return read_key(key_file)
    env = os.environ.get(KEY_ENV)
    return read_key(env) if env else None


def _checked_key(key: bytes, what: str) -> bytes:
    if not isinstance(key, bytes):
        raise ArtifactError(f"{what} must be bytes, not {type(key).__name__}")
    if len(key) < MIN_KEY_BYTES:
        raise ArtifactError(f"{what} has {len(key)} bytes; a key needs at least "
                            f"{MIN_KEY_BYTES} (e.g. `openssl rand -hex 32`)")
    return key


def _mac(key: bytes, manifest: bytes) -> str:
    return hmac.new(key, manifest, hashlib.sha256).hexdigest()


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


def memory_from_json(data: Any) -> MemoryPlan:
    """`memory_to_json` read back (users and tensors of each block are rebuilt from it).
    Every number is checked as it is read: `ScheduleError` names a block size or a tensor's
    node, index or block that is not a non-negative integer, or a block index out of range
    (a plan read from a file must not place a tensor outside the buffers; its fit to the
    program is `check_memory_plan`'s)."""
    if not isinstance(data, dict) or not isinstance(data.get("blocks"), list) \
            or not isinstance(data.get("block_of"), dict):
        raise ScheduleError("the memory plan is not {'blocks': [...], 'block_of': {...}}")
    blocks = []
    for i, entry in enumerate(data["blocks"]):
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], bool)):
            raise ScheduleError(f"memory plan block {i} is {entry!r}, not [size, dedicated]")
        blocks.append(Block(_count(entry[0], f"block {i}'s size"), entry[1]))
    block_of = {}
    for key, b in data["block_of"].items():
        node, colon, index = str(key).partition(":")
        if not colon or not node.isdigit() or not index.isdigit():
            raise ScheduleError(f"memory plan tensor {key!r} is not 'node:index'")
        ref = TensorRef(int(node), int(index))
        block = _count(b, f"tensor {key}'s block")
        if block >= len(blocks):
            raise ScheduleError(f"memory plan tensor {key} is in block {block}; the plan has "
                                f"{len(blocks)}")
        block_of[ref] = block
        blocks[block].tensors.append(ref)
    return MemoryPlan(blocks, block_of, _count(data.get("no_reuse_bytes"), "no_reuse_bytes"))


def _count(value: Any, what: str) -> int:
    """``value`` if it is a non-negative integer (not a bool, a float or text)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ScheduleError(f"the memory plan's {what} is {value!r}, not a non-negative "
                            "integer")
    return value


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
        members = {
            "kernels.so": lib.read_bytes(),
            "lowered.json": tvm.ir.save_json(bare).encode(),
            "schedule.json": schedule.dumps().encode(),
            "memory.json": json.dumps(memory_to_json(memory)).encode(),
        }
    sums = {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
            for name, data in members.items()}
    total = sum(len(_bytes_of(w)) for w in weights)

    def write(f: Any) -> None:
        with zipfile.ZipFile(f, "w") as z:
            digest = hashlib.sha256()
            with z.open(zipfile.ZipInfo(WEIGHTS), "w", force_zip64=total >= 2**31) as out:
                for w in weights:  # the tensors' own bytes (DLPack), no copy
                    data = _bytes_of(w)
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
                                                  "mac": _mac(key, manifest_bytes)}))

    atomic_write(path, write)
    return Path(path)


def _bytes_of(t: tvm.runtime.Tensor) -> memoryview:
    """A host tensor's bytes, without a copy."""
    return np.from_dlpack(t).reshape(-1).view(np.uint8).data


def _manifest(program: KernelProgram, schedule: Schedule, memory: MemoryPlan,
              info: Mapping[str, Any] | None, weights: list[tvm.runtime.Tensor],
              sums: dict[str, dict[str, Any]]) -> bytes:
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
        "weights": [{"dtype": str(w.dtype), "shape": [int(d) for d in w.shape]}
                    for w in weights],
        # the C++ kernels' forms chosen by timing in this process (this program's among
        # them): a loaded program's kernels start with them (`_chosen_forms`)
        "forms": native.chosen_forms() if program.sources().get("vendor") else {},
        "members": sums,
    }
    return json.dumps(manifest, indent=1, default=str).encode()


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


def read_manifest(path: str | os.PathLike, *, key: bytes | None = None) -> dict[str, Any]:
    """The manifest of the artifact at ``path``, checked for format, version and TVM (and its
    signature and sums, with a key: `read_artifact`)."""
    return _open(Path(path), artifact_key(key))[0]


def _open(path: Path, key: bytes | None, *, weights: bool = False
          ) -> tuple[dict[str, Any], dict[str, bytes], list[tvm.runtime.Tensor]]:
    """The manifest, the members and (with ``weights``) the weights of the artifact at
    ``path``, read into memory and checked (the signature first, with ``key``); nothing is
    written or loaded. The weights are read straight into the tensors the program keeps."""
    what = f"{path}"
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            if MANIFEST not in names:
                raise ArtifactError(f"{what} is not a paragraph artifact (no {MANIFEST})")
            manifest_bytes = z.read(MANIFEST)
            if key is not None:
                _check_signature(manifest_bytes, z.read(SIGNATURE) if SIGNATURE in names
                                 else None, key, what)
            manifest = json.loads(manifest_bytes)
            _check_manifest(manifest, what)
            members = {}
            for name in MEMBERS:
                if name not in names:
                    raise ArtifactError(f"{what} is incomplete: {name} is missing")
                members[name] = z.read(name)
            tensors = _read_weights(z, manifest, what) if weights else []
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
        entry = manifest["members"].get(name)
        want = entry.get("sha256") if isinstance(entry, dict) else None
        if not isinstance(want, str) or not hmac.compare_digest(
                hashlib.sha256(data).hexdigest().encode(), want.encode()):
            raise ArtifactError(f"{what} is corrupt: {name} does not match its checksum in the "
                                "manifest (the file was altered after it was written)")
    return manifest, members, tensors


def _read_weights(z: zipfile.ZipFile, manifest: dict[str, Any], what: str
                  ) -> list[tvm.runtime.Tensor]:
    """The weights member read into new tensors of the manifest's dtypes and shapes, its
    checksum checked on the way."""
    specs, entry = manifest.get("weights"), manifest["members"].get(WEIGHTS)
    if not isinstance(specs, list) or not isinstance(entry, dict):
        raise ArtifactError(f"{what}: the manifest does not describe its weights")
    if WEIGHTS not in z.namelist():
        raise ArtifactError(f"{what} is incomplete: {WEIGHTS} is missing")
    shapes = []
    for i, spec in enumerate(specs):
        try:
            dtype = np.dtype(str(spec["dtype"]))
            shape = tuple(spec["shape"])
            if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                       for d in shape):
                raise ValueError(shape)
        except (TypeError, KeyError, ValueError):
            raise ArtifactError(f"{what}: the manifest's weight {i} is not "
                                "{'dtype', 'shape'}") from None
        shapes.append((shape, dtype))
    total = sum(int(np.prod(s, dtype=object)) * d.itemsize for s, d in shapes)
    if total != entry.get("bytes") or total != z.getinfo(WEIGHTS).file_size:
        raise ArtifactError(f"{what} is corrupt: its weights take {total} bytes, "
                            f"{WEIGHTS} holds {z.getinfo(WEIGHTS).file_size}")
    digest, tensors = hashlib.sha256(), []
    with z.open(WEIGHTS) as f:
        for shape, dtype in shapes:
            t = tvm.runtime.empty(shape, str(dtype))
            view = _bytes_of(t)
            for start in range(0, len(view), 1 << 24):  # 16 MiB at a time
                chunk = f.read(min(1 << 24, len(view) - start))
                if len(chunk) != min(1 << 24, len(view) - start):
                    raise ArtifactError(f"{what} is truncated: {WEIGHTS} ends early")
                view[start:start + len(chunk)] = chunk
            digest.update(view)
            tensors.append(t)
    want = entry.get("sha256")
    if not isinstance(want, str) or not hmac.compare_digest(digest.hexdigest().encode(),
                                                            want.encode()):
        raise ArtifactError(f"{what} is corrupt: {WEIGHTS} does not match its checksum in the "
                            "manifest (the file was altered after it was written)")
    return tensors


def _check_signature(manifest: bytes, signature: bytes | None, key: bytes, what: str) -> None:
    """Refuse unless ``signature`` (the member's bytes, None where it is missing) is the
    HMAC of ``manifest`` under ``key``."""
    if signature is None:
        raise ArtifactError(f"{what} is not signed, and a key was given: refusing to load "
                            "native code whose origin cannot be checked (sign it with "
                            "export_library(key=...) or `paragraph compile --key-file`)")
    try:
        entry = json.loads(signature)
        algorithm, mac = entry["algorithm"], entry["mac"]
    except (ValueError, TypeError, KeyError):
        raise ArtifactError(f"{what}: its {SIGNATURE} is unreadable") from None
    if algorithm != "hmac-sha256" or not isinstance(mac, str):
        raise ArtifactError(f"{what} is signed with {algorithm!r}; paragraph checks "
                            "hmac-sha256")
    if not hmac.compare_digest(mac.encode(), _mac(key, manifest).encode()):
        raise ArtifactError(f"{what}: its signature does not match the key (signed with "
                            "another key, or the file was altered): refusing to load it")


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


def read_artifact(path: str | os.PathLike, device: tvm.runtime.Device | None = None, *,
                  key: bytes | None = None) -> Artifact:
    """Load the artifact at ``path``: checked (see the module docstring), its library loaded,
    its program linked on ``device`` (the target's default when None), ready to run.

    The artifact holds native code that runs in this process: load only one from a trusted
    source. With a key (``key``, else ``$PARAGRAPH_ARTIFACT_KEY``'s file: `artifact_key`)
    its signature and every member are checked before the library is written to disk or
    loaded; without one, only sums any editor can recompute."""
    path = Path(path)
    manifest, members, weights = _open(path, artifact_key(key), weights=True)
    what = str(path)
    try:
        target = tvm.target.Target(manifest["target"])
    except Exception as e:  # noqa: BLE001 - TVM raises its own error types for bad targets
        raise ArtifactError(f"{what}: unreadable target in the manifest ({e})") from None
    device = device or default_device(target)
    _check_device(manifest, target, device, what)
    try:  # the plan as data before any native code runs; its fit to the program below
        memory = memory_from_json(json.loads(members["memory.json"]))
    except (ScheduleError, ValueError) as e:
        raise ArtifactError(f"{what}: unreadable memory plan ({e})") from None
    forms = _chosen_forms(manifest, what)
    library = _load_library(members["kernels.so"], what)
    native.choose_forms(forms)  # before the kernels bind: each packs its chosen form only
    try:
        lowered = restored(tvm.ir.load_json(members["lowered.json"].decode()), weights)
        program = program_from_lowered(lowered, target, device=device,
                                       executable=relax.VMExecutable(library),
                                       vm_weights=weights)
        schedule = Schedule.from_json(members["schedule.json"].decode(), program.graph)
        _check_memory(program, schedule, memory)
    except ScheduleError as e:
        raise ArtifactError(f"{what}: its schedule or memory plan does not fit its program "
                            f"({e})") from None
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise ArtifactError(f"{what}: unreadable program ({type(e).__name__}: {e})") from None
    except ParagraphError as e:  # the program's metadata (program_from_lowered)
        raise ArtifactError(f"{what}: {e}") from None
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


def _chosen_forms(manifest: Mapping[str, Any], what: str) -> dict[str, int]:
    """The manifest's chosen forms (key -> non-negative index), checked as data."""
    forms = manifest.get("forms", {})
    if not isinstance(forms, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in forms.items()):
        raise ArtifactError(f"{what}: the manifest's forms are not {{key: index}}")
    return forms


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
