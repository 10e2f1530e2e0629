"""Artifacts hold native code: a key the file does not carry signs and checks them (HMAC-SHA256
of the manifest, which sums every member), before anything is written out or dlopened; a
memory plan read from a file is checked number by number and against its program."""

from __future__ import annotations

import hashlib
import json
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import paragraph
from paragraph.cli import main
from paragraph.graph import Graph, TensorRef
from paragraph.schedule import ScheduleError
from paragraph.tvm_interop.runtime import artifact
from paragraph.tvm_interop.runtime.artifact import (
    KEY_ENV,
    ArtifactError,
    artifact_key,
    memory_from_json,
    read_key,
)
from paragraph.tvm_interop.runtime.memory import (
    Block,
    MemoryPlan,
    check_memory_plan,
    plan_memory,
)

KEY = b"k" * 32
OTHER = b"o" * 32


def tiny_onnx(path: Path) -> Path:
    """y = relu(x @ W) + x, x (1, 8): two kernels, a weight, an output of its own."""
    w = numpy_helper.from_array(np.eye(8, dtype="float32") * 0.5, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("Add", ["r", "x"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny model built (TVM kernels, one stream), an unsigned and a signed artifact."""
    folder = tmp_path_factory.mktemp("trust")
    exe = paragraph.build(tiny_onnx(folder / "tiny.onnx"), kernels="tvm",
                          schedule="sequential")
    unsigned = exe.export_library(folder / "unsigned.paragraph")
    signed = exe.export_library(folder / "signed.paragraph", key=KEY)
    yield exe, unsigned, signed
    exe.close()


def _rewrite(src: Path, dst: Path, change) -> Path:
    """Copy the zip ``src`` to ``dst`` with ``change(name, data) -> data`` on every member."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            zout.writestr(item.filename, change(item.filename, zin.read(item.filename)))
    return dst


def _forged(src: Path, dst: Path, member: str, edit) -> Path:
    """What an attacker without the key can do: ``member`` edited and its sum in the manifest
    recomputed (every other byte, the signature too, left as it was)."""
    with zipfile.ZipFile(src) as z:
        new = edit(z.read(member))

    def change(name, data):
        if name == member:
            return new
        if name == "manifest.json":
            manifest = json.loads(data)
            manifest["members"][member] = {"sha256": hashlib.sha256(new).hexdigest(),
                                           "bytes": len(new)}
            return json.dumps(manifest).encode()
        return data

    return _rewrite(src, dst, change)


def _flip_byte(data: bytes) -> bytes:
    at = len(data) // 2
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


def _mapped(folder: Path) -> list[str]:
    """The lines of this process's memory map naming a file under ``folder``: a shared
    library loaded from there stays mapped (as "(deleted)" once its file is gone)."""
    return [line for line in Path("/proc/self/maps").read_text().splitlines()
            if str(folder) in line]


def test_a_signed_artifact_loads_with_its_key_and_runs(tiny):
    exe, unsigned, signed = tiny
    x = np.arange(8, dtype="float32").reshape(1, 8) - 3
    with zipfile.ZipFile(signed) as z:
        assert "signature.json" in z.namelist()
    with zipfile.ZipFile(unsigned) as z:
        assert "signature.json" not in z.namelist()
    with paragraph.load(signed, key=KEY) as loaded:
        np.testing.assert_allclose(loaded.run(x)[0], np.maximum(x * 0.5, 0) + x)
    with paragraph.load(signed) as loaded:  # no key: loads, checked by its sums only
        assert loaded.manifest["format"] == "paragraph-artifact"


def test_a_wrong_key_and_an_unsigned_file_are_refused(tiny):
    _, unsigned, signed = tiny
    with pytest.raises(ArtifactError, match="signature does not match the key"):
        paragraph.load(signed, key=OTHER)
    with pytest.raises(ArtifactError, match="is not signed, and a key was given"):
        paragraph.load(unsigned, key=KEY)
    with pytest.raises(ArtifactError, match="at least 16"):
        paragraph.load(signed, key=b"short")


def test_a_forged_library_is_refused_before_it_is_written_out_or_loaded(tiny, tmp_path,
                                                                         monkeypatch):
    """One byte of the kernel library changed and its sum recomputed, as anyone who edits the
    file can: without a key the sums cannot tell, with one it is refused, and nothing of it
    reached the disk or the process's memory map (where a dlopened library stays listed)."""
    _, _, signed = tiny
    forged = _forged(signed, tmp_path / "forged.paragraph", "kernels.so", _flip_byte)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the library is written
    with pytest.raises(ArtifactError, match="signature does not match"):
        paragraph.load(forged, key=KEY)
    assert _mapped(scratch) == [] and list(scratch.iterdir()) == []
    # a member edited without touching the manifest: its signed sum catches it
    edited = _rewrite(signed, tmp_path / "edited.paragraph",
                      lambda name, data: _flip_byte(data) if name == "kernels.so" else data)
    with pytest.raises(ArtifactError, match="kernels.so does not match its checksum"):
        paragraph.load(edited, key=KEY)
    assert _mapped(scratch) == []
    # the control: the genuine file is written there and dlopened from there (loaded afresh:
    # a process loads the same library bytes once, and an earlier test loaded these)
    monkeypatch.setattr(artifact, "_LIBRARIES", {})
    paragraph.load(signed, key=KEY).close()
    assert any("kernels.so" in line for line in _mapped(scratch))


def test_the_key_file_and_the_environment(tiny, tmp_path, monkeypatch):
    exe, unsigned, signed = tiny
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY + b"\n")  # as `openssl rand -hex 32 > key` leaves it
    assert read_key(key_file) == KEY
    monkeypatch.setenv(KEY_ENV, str(key_file))
    assert artifact_key() == KEY and artifact_key(OTHER) == OTHER
    with pytest.raises(ArtifactError, match="is not signed"):
        paragraph.load(unsigned)  # the environment's key applies to every load
    out = exe.export_library(tmp_path / "env.paragraph")  # and signs every export
    paragraph.load(out, key=KEY).close()
    monkeypatch.setenv(KEY_ENV, str(tmp_path / "missing"))
    with pytest.raises(ArtifactError, match="cannot be read"):
        paragraph.load(signed)
    (tmp_path / "short").write_bytes(b"abc")
    with pytest.raises(ArtifactError, match="has 3 bytes; a key needs at least 16"):
        read_key(tmp_path / "short")


def test_cli_signs_and_verifies_with_key_file(tiny, tmp_path, capsys):
    _, unsigned, signed = tiny
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.write_bytes(KEY)
    theirs.write_bytes(OTHER)
    out = tmp_path / "cli.paragraph"
    assert main(["compile", str(tiny_onnx(tmp_path / "m.onnx")), "--kernels", "tvm",
                 "--schedule", "sequential", "-o", str(out), "--key-file", str(mine)]) == 0
    assert main(["run", str(out), "--key-file", str(mine), "--repeat", "1"]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "--key-file", str(theirs), "--repeat", "1"]) == 2
    assert "signature does not match the key" in capsys.readouterr().err
    assert main(["inspect", str(unsigned), "--key-file", str(mine)]) == 2
    assert "is not signed" in capsys.readouterr().err


# ---------------------------------------------------------------------------- memory plans
def _doctored_plan(signed: Path, dst: Path, edit) -> Path:
    def change(data: bytes) -> bytes:
        plan = json.loads(data)
        edit(plan)
        return json.dumps(plan).encode()
    return _forged(signed, dst, "memory.json", change)


def _first(plan) -> str:
    return sorted(plan["block_of"])[0]


@pytest.mark.parametrize(("edit", "message"), [
    (lambda p: p["block_of"].update({_first(p): -1}), "block is -1, not a non-negative"),
    (lambda p: p["block_of"].update({_first(p): len(p["blocks"])}), r"in block \d+; the plan "
     r"has \d+"),
    (lambda p: p["block_of"].update({_first(p): "0"}), "block is '0'"),
    (lambda p: p["blocks"][0].__setitem__(0, -64), "block 0's size is -64"),
    (lambda p: p["blocks"][0].__setitem__(0, 1.5), "block 0's size is 1.5"),
    (lambda p: p["blocks"][0].__setitem__(0, 4), r"block 0 holds \d+ bytes in 4"),
    (lambda p: p["blocks"][0].__setitem__(0, 2**40), r"block 0 is 1099511627776 bytes, larger "
     "than"),
    (lambda p: p["blocks"].append([64, False]), r"block \d+ \(64 bytes\) holds no tensor"),
    (lambda p: p["block_of"].update({"9999:0": 0}), r"places %9999:0|9999"),
    (lambda p: p["block_of"].update({"-1:0": 0}), "is not 'node:index'"),
    (lambda p: p.update(blocks={}), "not {'blocks'"),
])
def test_a_doctored_memory_plan_is_refused(tiny, tmp_path, edit, message):
    """Every number of a memory plan read from an artifact is checked before the executor
    allocates by it: even with the sums recomputed (no key), an index out of range, a negative
    or fractional size, a tensor larger than its block, a block far larger than its tensors
    (an allocation by a file's say-so), an empty block or a tensor the program lacks is refused
    by name."""
    _, _, signed = tiny
    bad = _doctored_plan(signed, tmp_path / "plan.paragraph", edit)
    with pytest.raises(ArtifactError, match=message):
        paragraph.load(bad)


def test_memory_plans_made_from_data_are_checked(tiny):
    """`memory_from_json` and `MemoryPlan` themselves, and views outside their source."""
    exe, _, _ = tiny
    with pytest.raises(ScheduleError, match="block is -2"):
        memory_from_json({"blocks": [[64, False]], "block_of": {"3:0": -2},
                          "no_reuse_bytes": 64})
    with pytest.raises(ScheduleError, match=r"puts %3 in block 1; it has 1 blocks"):
        MemoryPlan([Block(64)], {TensorRef(3, 0): 1}, 64)
    with pytest.raises(ScheduleError, match="block 0 has size -1"):
        MemoryPlan([Block(-1)], {}, 0)
    with pytest.raises(ScheduleError, match="no_reuse_bytes is None"):
        memory_from_json({"blocks": [[64, False]], "block_of": {"3:0": 0}})
    graph = exe.program.graph
    plan = plan_memory(graph, exe.schedule)
    check_memory_plan(graph, exe.schedule, plan)  # the plan as made fits
    # a view (a slice at a byte offset) reading past its source, or before it
    kernel = next(n for n in graph.nodes if n.kind == "kernel" and n.inputs
                  and graph.type_of(n.inputs[0]) == n.outputs[0])
    for offset in (-4, 4):
        viewed = Graph([n.replace(kind="view", attrs={"offset": offset, "func": "v"})
                        if n.id == kernel.id else n for n in graph.nodes], graph.outputs,
                       graph.meta)
        with pytest.raises(ScheduleError, match=f"at offset {offset}"):
            check_memory_plan(viewed, exe.schedule, plan)
