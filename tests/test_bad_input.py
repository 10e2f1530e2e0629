"""Bad input, every one a clear line: each input of docs/reliability.md's "Bad input" table,
tried through the public entry points (`paragraph.build`, `paragraph.load`,
`ParallelExecutable.run`, the rule library's loader, the RPC client), fails with a
`ParagraphError` whose message names the problem, and never hangs, crashes or allocates what
the machine does not have. NaN and Inf inputs are not errors: they run, and a NaN propagates."""

from __future__ import annotations

import json
import re
import socket
import struct
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
import tvm.rpc
from onnx import TensorProto, helper, numpy_helper

import paragraph
from paragraph.cli import main
from paragraph.errors import (
    InputError,
    ModelLoadError,
    ModelTooLargeError,
    ParagraphError,
    RuleLibraryError,
    UnsupportedModelError,
)
from paragraph.rules.library import LIBRARY_PATH, _entry_hash, load_library
from paragraph.tvm_interop.meter.remote import Remote, _probe_tracker
from paragraph.tvm_interop.runtime.artifact import ArtifactError
from paragraph.tvm_interop.runtime.memory import Block, MemoryPlan, check_fits

ROOT = Path(__file__).resolve().parent.parent
BUILD = {"kernels": "tvm", "schedule": "sequential"}  # nothing measured: fast


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "m", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _info(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _save(model, folder: Path, name: str) -> Path:
    path = folder / f"{name}.onnx"
    onnx.save(model, path)
    return path


def _affine():
    """y = x @ W + b, x (2, 4): every output element of a row reads every element of it."""
    w = numpy_helper.from_array(np.arange(12, dtype="float32").reshape(4, 3) / 10, "w")
    b = numpy_helper.from_array(np.ones(3, "float32"), "b")
    return _model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                   helper.make_node("Add", ["h", "b"], ["y"])],
                  [_info("x", [2, 4])], [_info("y", [2, 3])], [w, b])


def _embedding():
    """y = table[ids], a (10, 4) table: ids must lie in [0, 10)."""
    table = numpy_helper.from_array(np.arange(40, dtype="float32").reshape(10, 4), "table")
    return _model([helper.make_node("Gather", ["table", "ids"], ["y"])],
                  [_info("ids", [1, 3], TensorProto.INT64)], [_info("y", [1, 3, 4])], [table])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("bad")


@pytest.fixture(scope="module")
def affine(folder):
    exe = paragraph.build(_save(_affine(), folder, "affine"), **BUILD)
    yield exe
    exe.close()


@pytest.fixture(scope="module")
def exes(affine, folder):
    embedding = paragraph.build(_save(_embedding(), folder, "embedding"), **BUILD)
    yield {"affine": affine, "embedding": embedding}
    embedding.close()


@pytest.fixture(scope="module")
def artifact(affine, folder):
    return affine.export_library(folder / "affine.paragraph")


# ---------------------------------------------------------------------------- model files
def _malformed(folder):
    path = folder / "malformed.onnx"
    path.write_bytes(b"\x08\x07garbage, not a protobuf \xff\xfe")
    return paragraph.build(path, **BUILD)


def _truncated(folder):
    data = _affine().SerializeToString()
    path = folder / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    return paragraph.build(path, **BUILD)


def _dynamic(folder):
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_info("x", ["batch", 4])],
                   [_info("y", ["batch", 4])])
    return paragraph.build(_save(model, folder, "dynamic"), **BUILD)


def _unknown_op(folder):
    # DFT is an ONNX operator (opset 17) that TVM's ONNX frontend does not convert
    model = _model([helper.make_node("DFT", ["x"], ["y"])], [_info("x", [1, 8, 1])],
                   [_info("y", [1, 8, 2])])
    return paragraph.build(_save(model, folder, "unknown_op"), **BUILD)


def _missing_file(folder):
    return paragraph.build(folder / "nowhere.onnx", **BUILD)


def _unknown_extension(folder):
    path = folder / "model.tflite"
    path.write_bytes(b"TFL3")
    return paragraph.build(path, **BUILD)


def _identity(folder):
    model = _model([helper.make_node("Identity", ["x"], ["y"])], [_info("x", [1, 4])],
                   [_info("y", [1, 4])])
    return paragraph.build(_save(model, folder, "identity"), **BUILD)


def _no_nodes(folder):
    model = _model([], [_info("x", [1, 4])], [_info("x", [1, 4])])
    return paragraph.build(_save(model, folder, "no_nodes"), **BUILD)


def _huge_constant(folder):
    # a 2^20 x 2^20 float constant (4 TiB) declared by ConstantOfShape: refused before any of it
    # is made, where folding it would have asked for 4 TiB
    shape = numpy_helper.from_array(np.array([1 << 20, 1 << 20], "int64"), "shape")
    model = _model([helper.make_node("ConstantOfShape", ["shape"], ["c"],
                                     value=helper.make_tensor("v", TensorProto.FLOAT, [1],
                                                              [1.0])),
                    helper.make_node("Add", ["x", "c"], ["y"])],
                   [_info("x", [1, 1 << 20])], [_info("y", [1 << 20, 1 << 20])], [shape])
    return paragraph.build(_save(model, folder, "huge_constant"), **BUILD)


def _huge_input(folder):
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_info("x", [1 << 19, 1 << 19])],
                   [_info("y", [1 << 19, 1 << 19])])
    return paragraph.build(_save(model, folder, "huge_input"), **BUILD)


def _unknown_target(folder):
    return paragraph.build(_save(_affine(), folder, "target"), target="nosuchtarget", **BUILD)


def _bad_input_shapes(folder):
    return paragraph.build(_save(_affine(), folder, "shapes"), input_shapes={"y": (2, 4)},
                           **BUILD)


# ---------------------------------------------------------------------------- runs
def _run_none(exes, folder):
    affine = exes["affine"]
    return affine.run()


def _run_two(exes, folder):
    affine = exes["affine"]
    x = np.zeros((2, 4), "float32")
    return affine.run(x, x)


def _run_shape(exes, folder):
    affine = exes["affine"]
    return affine.run(np.zeros((3, 4), "float32"))


def _run_dtype(exes, folder):
    affine = exes["affine"]
    return affine.run(np.zeros((2, 4), "float64"))


def _run_list(exes, folder):
    affine = exes["affine"]
    return affine.run([[0.0] * 4] * 2)


def _token_ids(exes, folder):
    return exes["embedding"].run(np.array([[0, 10, 2]], "int64"))


def _negative_token_ids(exes, folder):
    # -10 is row 0, as ONNX's Gather counts from the end
    return exes["embedding"].run(np.array([[0, -11, 2]], "int64"))


def _too_large_for_the_device(exes, folder):
    affine = exes["affine"]
    graph = affine.program.graph
    plan = MemoryPlan([Block(1 << 50)], {}, 1 << 50)  # a petabyte of blocks
    return check_fits(graph, plan, tvm.cpu())


# ---------------------------------------------------------------------------- artifacts
def _artifact_not_zip(artifact, folder):
    path = folder / "text.paragraph"
    path.write_text("not an artifact")
    return paragraph.load(path)


def _artifact_foreign_zip(artifact, folder):
    path = folder / "foreign.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("hello.txt", "hi")
    return paragraph.load(path)


def _artifact_truncated(artifact, folder):
    data = artifact.read_bytes()
    path = folder / "cut.paragraph"
    path.write_bytes(data[: len(data) // 2])
    return paragraph.load(path)


def _rewritten(artifact, path, change):
    """A copy of ``artifact`` at ``path`` with ``change(name, data) -> data`` applied to each
    member (the manifest is one too)."""
    with zipfile.ZipFile(artifact) as zin, zipfile.ZipFile(path, "w") as zout:
        for item in zin.infolist():
            zout.writestr(item.filename, change(item.filename, zin.read(item.filename)))
    return path


def _artifact_corrupt_member(artifact, folder):
    return paragraph.load(_rewritten(
        artifact, folder / "corrupt.paragraph",
        lambda name, data: data[:-1] if name == "lowered.json" else data))


def _stale_manifest(name, data):
    if name != "manifest.json":
        return data
    manifest = json.loads(data)
    manifest["version"] = 0
    return json.dumps(manifest).encode()


def _artifact_stale(artifact, folder):
    return paragraph.load(_rewritten(artifact, folder / "stale.paragraph", _stale_manifest))


def _artifact_directory(artifact, folder):
    return paragraph.load(folder)


# ---------------------------------------------------------------------------- rule libraries
def _rules(folder, name, text: bytes | str):
    path = folder / f"{name}.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return load_library(path)


def _shipped() -> dict:
    return json.loads(LIBRARY_PATH.read_text())


def _rules_not_json(folder):
    return _rules(folder, "garbage", b"\x00\x01{not json")


def _rules_truncated(folder):
    text = LIBRARY_PATH.read_text()
    return _rules(folder, "cut", text[: len(text) // 2])


def _rules_foreign(folder):
    return _rules(folder, "foreign", json.dumps({"format": "something", "rules": []}))


def _rules_not_a_list(folder):
    data = _shipped()
    data["rules"] = 5
    return _rules(folder, "number", json.dumps(data))


def _rules_edited(folder):
    data = _shipped()
    data["rules"][0]["name"] += " (edited)"  # its hash left as it was
    return _rules(folder, "edited", json.dumps(data))


def _rules_unverified(folder):
    data = _shipped()
    entry = data["rules"][0]
    entry["proof"] = {**entry.get("proof", {}), "status": "unknown"}
    entry["hash"] = _entry_hash(entry)  # recomputed, as an editor could
    return _rules(folder, "unverified", json.dumps(data))


MODELS = {
    "malformed-onnx": (_malformed, ModelLoadError, "is not a readable ONNX file"),
    "truncated-onnx": (_truncated, ModelLoadError, "is not a readable ONNX file|is not an ONNX "
                       "model"),
    "dynamic-onnx": (_dynamic, UnsupportedModelError, r"ONNX input 'x' is dynamic \(dims "
                     r"\['batch', 4\]\); paragraph needs static shapes"),
    "unknown-op": (_unknown_op, UnsupportedModelError, "not supported for frontend ONNX: DFT"),
    "missing-file": (_missing_file, ModelLoadError, "nowhere.onnx: no such file"),
    "unknown-extension": (_unknown_extension, ModelLoadError, "unknown model file extension "
                          "'.tflite'"),
    "identity-model": (_identity, UnsupportedModelError, "the model computes nothing"),
    "empty-graph": (_no_nodes, UnsupportedModelError, "the model computes nothing"),
    "huge-constant": (_huge_constant, ModelTooLargeError, r"needs at least 8192.0 GiB .*; "
                      "this machine has .* GiB of memory"),
    "huge-input": (_huge_input, ModelTooLargeError, r"needs at least 2048.0 GiB \(its inputs, "
                   "weights and outputs"),
    "unknown-target": (_unknown_target, ParagraphError, "not a target TVM knows: "
                       "'nosuchtarget'"),
    "input-shapes-unknown-name": (_bad_input_shapes, ModelLoadError, "input_shapes names "
                                  r"\['y'\], which are not inputs"),
    "rules-not-json": (_rules_not_json, RuleLibraryError, "not a readable JSON rule library"),
    "rules-truncated": (_rules_truncated, RuleLibraryError, "not a readable JSON rule library"),
    "rules-foreign": (_rules_foreign, RuleLibraryError, "not a paragraph rule library"),
    "rules-not-a-list": (_rules_not_a_list, RuleLibraryError, r"its 'rules' is not a list of "
                         r"rules \(it is a JSON int\)"),
    "rules-edited": (_rules_edited, RuleLibraryError, "content hash mismatch"),
    "rules-unverified": (_rules_unverified, RuleLibraryError, "proof status is 'unknown', not "
                         "'verified'"),
}

RUNS = {
    "no-inputs": (_run_none, InputError, r"the model takes 1 input\(s\): x float32\[2, 4\]"),
    "too-many-inputs": (_run_two, InputError, r"takes 1 input\(s\) \('x'\), got 2"),
    "wrong-shape": (_run_shape, InputError, r"input 0 \('x'\) must be float32\[2, 4\], got "
                    r"float32\[3, 4\]"),
    "wrong-dtype": (_run_dtype, InputError, r"must be float32\[2, 4\], got float64\[2, 4\]"),
    "not-an-array": (_run_list, InputError, r"must be an array of float32\[2, 4\] \(numpy or "
                     r"TVM\), got a list"),
    "token-id-too-large": (_token_ids, InputError, r"input 0 \('ids'\) holds 10 at \[0, 1\], "
                           r"out of range for relax.take .*: its values must lie in \[-10, 10\)"),
    "token-id-negative": (_negative_token_ids, InputError, r"holds -11 at \[0, 1\], out of "
                          "range"),
    "too-large-for-device": (_too_large_for_the_device, ModelTooLargeError, r"the program needs "
                             r"1048576\.0 GiB \(its memory plan's 1 blocks 1048576\.0 GiB, its "
                             r"inputs and weights 0\.0 GiB\); this machine's memory is"),
}

ARTIFACTS = {
    "artifact-not-zip": (_artifact_not_zip, ArtifactError, "is not a paragraph artifact"),
    "artifact-foreign-zip": (_artifact_foreign_zip, ArtifactError, r"not a paragraph artifact "
                             r"\(no manifest.json\)"),
    "artifact-truncated": (_artifact_truncated, ArtifactError, "truncated or damaged"),
    "artifact-corrupt-member": (_artifact_corrupt_member, ArtifactError, "lowered.json does not "
                                "match its checksum"),
    "artifact-stale": (_artifact_stale, ArtifactError, "is a version 0 artifact .* compile the "
                       "model again"),
    "artifact-directory": (_artifact_directory, ArtifactError, "is a directory"),
}


@pytest.mark.parametrize("case", MODELS)
def test_bad_models_and_files(case, folder):
    make, error, message = MODELS[case]
    with pytest.raises(error, match=message):
        make(folder)


@pytest.mark.parametrize("case", RUNS)
def test_bad_runs(case, exes, folder):
    make, error, message = RUNS[case]
    with pytest.raises(error, match=message):
        make(exes, folder)


@pytest.mark.parametrize("case", ARTIFACTS)
def test_bad_artifacts(case, artifact, folder):
    make, error, message = ARTIFACTS[case]
    with pytest.raises(error, match=message):
        make(artifact, folder)


def test_nan_and_inf_inputs_run_and_nan_propagates(affine):
    """No error for NaN or Inf: the kernels compute as IEEE arithmetic does. A NaN reaches every
    output element that reads it (here the whole row of a product), and the other rows stay
    finite; an Inf gives +-Inf or NaN where it meets a zero weight."""
    x = np.array([[np.nan, 1, 2, 3], [0, 1, 2, 3]], "float32")
    y = affine.run(x)[0]
    assert np.isnan(y[0]).all() and np.isfinite(y[1]).all()
    x = np.array([[np.inf, 1, 2, 3], [-np.inf, 0, 0, 0]], "float32")
    y = affine.run(x)[0]
    # W's first row is (0, 0.1, 0.2): inf * 0 is NaN, inf * 0.1 is inf
    assert np.isnan(y[0, 0]) and np.isposinf(y[0, 1:]).all() and np.isneginf(y[1, 1:]).all()


# ---------------------------------------------------------------------------- RPC
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_rpc_tracker_fails_fast():
    """A closed port is refused at once (TVM's own connect would retry for a minute), through
    the API and the CLI."""
    port = _closed_port()
    start = time.monotonic()
    with pytest.raises(ParagraphError, match=f"no tracker at 127.0.0.1:{port}"):
        Remote(f"127.0.0.1:{port}:key")
    assert main(["run", "squeezenet1_1", "--reduced", "--rpc", f"127.0.0.1:{port}:key"]) == 2
    assert time.monotonic() - start < 10


def test_a_silent_rpc_tracker_fails_within_the_timeout():
    """A port that accepts and never answers (TVM's handshake waited on it for good) is
    refused within the timeout."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        held: list[socket.socket] = []
        threading.Thread(target=lambda: held.append(server.accept()[0]), daemon=True).start()
        port = server.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(ParagraphError, match=f"127.0.0.1:{port} did not answer as an RPC "
                           "tracker within 1 s"):
            Remote(f"127.0.0.1:{port}:key", timeout=1.0)
        assert time.monotonic() - start < 10
        for conn in held:
            conn.close()


def _answering(reply: bytes):
    """A server on loopback that answers every connection's first 4 bytes with ``reply``;
    (its port, a function that stops it)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed: done
                return
            with conn:
                conn.recv(4)
                conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1], server.close


def test_the_tracker_probe_takes_the_trackers_handshake_only():
    """The probe sends TVM's tracker magic and wants it back (as a tracker answers: the
    remote tests run it against a real one); anything else is not a tracker."""
    port, stop = _answering(struct.pack("<i", tvm.rpc.base.RPC_TRACKER_MAGIC))
    try:
        _probe_tracker("test", "127.0.0.1", port, 5.0)
    finally:
        stop()
    port, stop = _answering(b"HTTP")
    try:
        with pytest.raises(ParagraphError, match="is not a TVM RPC tracker"):
            _probe_tracker("test", "127.0.0.1", port, 5.0)
    finally:
        stop()


# ---------------------------------------------------------------------------- the table
def test_the_reliability_page_lists_every_case():
    """docs/reliability.md's "Bad input" table has a row for every case tried here."""
    text = (ROOT / "docs" / "reliability.md").read_text()
    section = text.split("## Bad input", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `([a-z0-9-]+)` \|", section, flags=re.M))
    cases = {*MODELS, *RUNS, *ARTIFACTS, "nan-inf-inputs", "rpc-closed-port", "rpc-silent"}
    assert cases <= rows, sorted(cases - rows)
