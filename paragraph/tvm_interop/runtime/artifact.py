"""The one-file artifact's format, and reading it with TVM's runtime alone: what a deployment
needs (`paragraph.load`). `paragraph.tvm_interop.build.artifact` writes it.

A zip archive (nothing in it is pickled) of

* ``manifest.json``: format and version, the paragraph and TVM versions that wrote it, target,
  machine (with the instruction-set flags its code may use), kernel sources, library rules
  applied (with their content hashes), the search and schedule reports, the model's inputs
  and outputs, and a SHA-256 of every other member;
* ``kernels.so``: every kernel and the VM code (``relax.VMExecutable.export_library``), whose
  ``main`` takes the weights after the inputs;
* ``program.json``: the kernel graph the executor runs (`graph_to_json`): kernels by function
  name, views, inputs, and each weight as its index in ``weights.bin``;
* ``lowered.json``: the lowered module (``tvm.ir.save_json``, weights replaced by
  placeholders), read only when asked for (`KernelProgram.lowered`: exporting again, the TVM
  VM), which needs TVM's compiler;
* ``weights.bin``: the weights, once, as raw bytes in the placeholders' order (their dtypes
  and shapes in the manifest), stored uncompressed and streamed: read straight into the
  tensors the program keeps;
* ``schedule.json`` (`paragraph.schedule.Schedule`) and ``memory.json`` (the block of every
  tensor, `MemoryPlan`);
* ``signature.json``, only in a signed artifact: an HMAC-SHA256 of the manifest's bytes.

Reading needs TVM's runtime only: the program is linked from ``program.json``, the kernel
library and the vendor kernels, so a process that only loads and runs artifacts need not load
TVM's compiler or PyTorch (`paragraph.lean`; ResNet-18's process peaked at 578 MiB with them).
Given `CompilerParts` (`paragraph.tvm_interop.build.artifact` does) the program also has its
target and lowered module; without, its TVM VM runs the library as it is.

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
written by another format version or another TVM, and one compiled for a CPU with
instructions this one lacks, or for a GPU this machine lacks. The memory plan is checked as
data (`memory_from_json`: block indices in range, sizes non-negative) and against the kernel
graph (`check_memory_plan`: every tensor fits its block, views lie inside their source, no
block larger than what it holds, no two live tensors share one), and the schedule against the
graph, so a loaded program runs as it was compiled and a doctored plan cannot make the
executor write outside a buffer.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import tempfile
import threading
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from paragraph.errors import ParagraphError
from paragraph.graph import Graph, Node, TensorRef, TensorType
from paragraph.inputs import IndexRange
from paragraph.machine import cpu_flags
from paragraph.schedule import Schedule, ScheduleError
from paragraph.tvm_interop.runtime.library import native
from paragraph.tvm_interop.runtime.library.names import is_vendor_name
from paragraph.tvm_interop.runtime.library.torch_kernels import ensure_registered
from paragraph.tvm_interop.runtime.memory import Block, MemoryPlan, check_memory_plan
from paragraph.tvm_interop.runtime.program import KernelProgram, Once, needs_compiler
from paragraph.version import __version__

FORMAT, VERSION = "paragraph-artifact", 3  # 2: weights once, raw; 3: program.json
MANIFEST = "manifest.json"
PROGRAM = "program.json"
LOWERED = "lowered.json"
MEMBERS = ("kernels.so", PROGRAM, LOWERED, "schedule.json", "memory.json")  # read whole
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


def signature_mac(key: bytes, manifest: bytes) -> str:
    """The HMAC-SHA256 (hex) of a manifest's bytes under ``key``: what ``signature.json``
    holds."""
    return hmac.new(key, manifest, hashlib.sha256).hexdigest()


def bytes_of(t: tvm.runtime.Tensor) -> memoryview:
    """A host tensor's bytes, without a copy."""
    return np.from_dlpack(t).reshape(-1).view(np.uint8).data


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


# ---------------------------------------------------------------------------- the kernel graph
def graph_to_json(graph: Graph, weights: Sequence[np.ndarray]) -> dict[str, Any]:
    """The kernel graph as JSON values: each node's kind, name, inputs, output types and
    attributes; a weight or constant node's value as its index in ``weights`` (arrays that
    share its bytes, or equal it) or, for a small one not among them, inline (base64). The
    graph's ``meta`` entries that are JSON values go too."""
    by_address = {(w.ctypes.data, w.shape, w.dtype.str): i for i, w in enumerate(weights)}
    by_content: dict[tuple, int] | None = None
    nodes = []
    for n in graph.nodes:
        entry: dict[str, Any] = {
            "id": n.id, "kind": n.kind, "name": n.name,
            "inputs": [[r.node, r.index] for r in n.inputs],
            "outputs": [[list(t.shape), t.dtype] for t in n.outputs],
            "attrs": dict(n.attrs)}
        if n.value is not None:
            v = n.value
            index = by_address.get((v.ctypes.data, v.shape, v.dtype.str))
            if index is None:
                if by_content is None:
                    by_content = {(w.shape, w.dtype.str, hashlib.sha256(w.tobytes()).digest()): i
                                  for i, w in enumerate(weights)}
                index = by_content.get((v.shape, v.dtype.str,
                                        hashlib.sha256(v.tobytes()).digest()))
            if index is not None:
                entry["weight"] = index
            else:
                entry["value"] = {"dtype": v.dtype.str, "shape": list(v.shape),
                                  "data": base64.b64encode(np.ascontiguousarray(v).tobytes())
                                  .decode()}
        nodes.append(entry)
    meta = {}
    for k, v in graph.meta.items():
        try:
            meta[k] = json.loads(json.dumps(v))
        except (TypeError, ValueError):  # a TVM object (Relax attributes): not needed to run
            pass
    return {"nodes": nodes, "outputs": [[r.node, r.index] for r in graph.outputs],
            "meta": meta}


def _tupled(value: Any) -> Any:
    """JSON's lists back as the tuples a node's attributes hold (hashable)."""
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value


def graph_from_json(data: Any, weights: Sequence[np.ndarray]) -> Graph:
    """`graph_to_json` read back, each weight node given its array of ``weights``. Raises
    `ParagraphError` naming what is malformed (`Graph` checks the structure: ids, topological
    order, inputs that exist)."""
    try:
        nodes = []
        for entry in data["nodes"]:
            value = None
            if "weight" in entry:
                index = entry["weight"]
                if isinstance(index, bool) or not isinstance(index, int) \
                        or not 0 <= index < len(weights):
                    raise ValueError(f"node {entry['id']}'s weight {index!r} is not one of the "
                                     f"{len(weights)} weights")
                value = weights[index]
            elif "value" in entry:
                v = entry["value"]
                value = np.frombuffer(base64.b64decode(v["data"]), np.dtype(v["dtype"])
                                      ).reshape(v["shape"])
                if value.dtype != np.bool_:  # in a TVM tensor: aligned, as kernels assume
                    value = np.from_dlpack(tvm.runtime.tensor(value))
            outputs = tuple(TensorType(tuple(int(d) for d in shape), str(dtype))
                            for shape, dtype in entry["outputs"])
            if value is not None and (len(outputs) != 1 or value.shape != outputs[0].shape
                                      or value.dtype != np.dtype(outputs[0].dtype)):
                raise ValueError(f"node {entry['id']}'s value is {value.dtype}{list(value.shape)}"
                                 f", its type {outputs}")
            nodes.append(Node(int(entry["id"]), str(entry["kind"]),
                              tuple(TensorRef(int(a), int(b)) for a, b in entry["inputs"]),
                              outputs, {str(k): _tupled(v) for k, v in entry["attrs"].items()},
                              str(entry["name"]), value))
        return Graph(nodes, [TensorRef(int(a), int(b)) for a, b in data["outputs"]],
                     data.get("meta", {}))
    except ParagraphError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        raise ParagraphError(f"malformed program: {type(e).__name__}: {e}") from None


@dataclass(frozen=True)
class CompilerParts:
    """What TVM's compiler adds to a program read from an artifact
    (`paragraph.tvm_interop.build.artifact.COMPILER`): its target from the manifest's
    (``target``, which also refuses a CPU of another name), its lowered module from
    ``lowered.json``'s bytes and the weights (``lowered``), and the kernel library as the TVM
    VM's executable (``executable``)."""

    target: Callable[[Mapping[str, Any], tvm.runtime.Device, str], tvm.target.Target]
    lowered: Callable[[bytes, Sequence[tvm.runtime.Tensor]], tvm.IRModule]
    executable: Callable[[tvm.runtime.Module], Any]


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
            view = bytes_of(t)
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
    if not hmac.compare_digest(mac.encode(), signature_mac(key, manifest).encode()):
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


def _device(manifest: Mapping[str, Any], device: tvm.runtime.Device | None,
            what: str) -> tvm.runtime.Device:
    """The device the artifact runs on (``device``, else its kind's first), refused where it
    is missing or lacks an instruction the artifact's code may use."""
    gpu = manifest.get("device") == "cuda"
    device = device or (tvm.cuda(0) if gpu else tvm.cpu(0))
    if gpu:
        if not device.exist:
            target = manifest.get("target", {})
            arch = target.get("arch", "") if isinstance(target, dict) else ""
            raise ArtifactError(f"{what} was compiled for cuda {arch}, and there is no such "
                                "device here")
        return device
    flags, here = manifest.get("cpu_flags", []), cpu_flags()
    if not isinstance(flags, list):
        raise ArtifactError(f"{what}: the manifest's cpu_flags are not a list")
    missing = sorted(set(map(str, flags)) - here) if here is not None else []
    if missing:
        raise ArtifactError(f"{what} was compiled on {manifest.get('machine', {}).get('cpu', '?')}"
                            f", whose instructions {', '.join(missing)} this CPU lacks: compile "
                            "the model on (or for) this machine")
    return device


def _registered_on_call(name: str) -> Callable[..., object]:
    """Vendor function ``name`` as a call that registers its Python kernel on first use: on a
    CPU the executor binds the C++ kernel instead, so PyTorch's Python package (about 120
    MiB) loads only where a kernel needs it."""
    def call(*args: Any) -> object:
        ensure_registered(name)
        return tvm.get_global_func(name)(*args)
    return call


def _registered(graph: Graph, library: tvm.runtime.Module) -> tvm.runtime.Module:
    """``library``, once every vendor kernel of ``graph`` is registered as the global function
    that the TVM VM calls it by."""
    for n in graph.nodes:
        if n.kind == "kernel" and n.attrs.get("source") == "vendor" \
                and is_vendor_name(str(n.attrs["func"])):
            ensure_registered(str(n.attrs["func"]))
    return library


def _link(graph: Graph, library: tvm.runtime.Module, device: tvm.runtime.Device, what: str
          ) -> dict[str, Callable[..., object]]:
    """Kernel function name -> function for every kernel of ``graph``: TVM's from the
    artifact's library, vendor kernels by their global names (on a CPU, registered on first
    call: `_registered_on_call`)."""
    on_cpu = device.dlpack_device_type() == tvm.cpu().dlpack_device_type()
    functions: dict[str, Callable[..., object]] = {}
    for n in graph.nodes:
        if n.kind != "kernel" or n.attrs["func"] in functions:
            continue
        name = str(n.attrs["func"])
        fn: Callable[..., object] | None
        if n.attrs.get("source") == "vendor":
            fn = tvm.get_global_func(name, allow_missing=True)
            if fn is None and is_vendor_name(name):
                if on_cpu:
                    fn = _registered_on_call(name)
                else:
                    ensure_registered(name)
                    fn = tvm.get_global_func(name, allow_missing=True)
        else:
            try:
                fn = library.get_function(name, query_imports=True)
            except AttributeError:  # tvm-ffi's word for a function the module lacks
                fn = None
        if fn is None:
            raise ArtifactError(f"{what}: kernel {name!r} is missing from its kernel library")
        functions[name] = fn
    return functions


def read_artifact(path: str | os.PathLike, device: tvm.runtime.Device | None = None, *,
                  key: bytes | None = None, compiler: CompilerParts | None = None) -> Artifact:
    """Load the artifact at ``path``: checked (see the module docstring), its library loaded,
    its program linked on ``device`` (the artifact's kind's first when None), ready to run.
    Without ``compiler`` the program has no target or lowered module (asking raises
    `CompilerNeededError`): what TVM's runtime alone can read; its TVM VM runs.

    The artifact holds native code that runs in this process: load only one from a trusted
    source. With a key (``key``, else ``$PARAGRAPH_ARTIFACT_KEY``'s file: `artifact_key`)
    its signature and every member are checked before the library is written to disk or
    loaded; without one, only sums any editor can recompute."""
    path = Path(path)
    manifest, members, weights = _open(path, artifact_key(key), weights=True)
    what = str(path)
    device = _device(manifest, device, what)
    target = compiler.target(manifest, device, what) if compiler is not None else None
    try:  # the plan as data before any native code runs; its fit to the program below
        memory = memory_from_json(json.loads(members["memory.json"]))
    except (ScheduleError, ValueError) as e:
        raise ArtifactError(f"{what}: unreadable memory plan ({e})") from None
    forms = _chosen_forms(manifest, what)
    try:
        info = manifest.get("program", {})
        ranges = {int(k): IndexRange.from_json(v)
                  for k, v in info.get("input_ranges", {}).items()}
        arrays = [np.from_dlpack(w) for w in weights]
        graph = graph_from_json(json.loads(members[PROGRAM]), arrays)
    except ParagraphError as e:
        raise ArtifactError(f"{what}: {e}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ArtifactError(f"{what}: unreadable program ({type(e).__name__}: {e})") from None
    library = _load_library(members["kernels.so"], what)
    native.choose_forms(forms)  # before the kernels bind: each packs its chosen form only
    functions = _link(graph, library, device, what)
    if compiler is None:  # TVM's runtime runs the VM from the library as it is
        lowered, target_once = needs_compiler("the lowered module"), needs_compiler("the target")
        compiled: Once[Any] = Once(lambda: _registered(graph, library))
    else:
        # the program keeps lowered.json's bytes alone (not the kernel library's and the
        # other members') for its lowered module, read on first use
        parts, lowered_json = compiler, members[LOWERED]
        lowered = Once(lambda: parts.lowered(lowered_json, weights))
        target_once = Once.of(target)
        compiled = Once(lambda: parts.executable(_registered(graph, library)))
    program = KernelProgram(graph, device, functions, lowered, target_once, compiled,
                            kernel_source=str(manifest.get("kernels", "tvm")),
                            rewrites=tuple(str(r) for r in info.get("rewrites", ())),
                            input_ranges=ranges, vm_weights=tuple(weights))
    try:
        schedule = Schedule.from_json(members["schedule.json"].decode(), program.graph)
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
