"""`paragraph.build` -> `ParallelExecutable` -> one-file artifact -> `paragraph.load`: every
program kind (plain, IOS-merged, split, searched) reloads in a fresh process with equal outputs
and the same schedule; foreign, truncated, altered and stale files are refused by name."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tvm

import paragraph
from paragraph import models
from paragraph.errors import InputError
from paragraph.passes.ios import apply_merges, merge_rule
from paragraph.planner import Session, plan_schedule, split_program
from paragraph.tvm_interop.build.program import build_program
from paragraph.tvm_interop.frontend.relax_graph import random_inputs
from paragraph.tvm_interop.runtime.artifact import ArtifactError, is_artifact, read_manifest
from paragraph.tvm_interop.runtime.program import KernelProgram
from paragraph.tvm_interop.runtime.vm import run_vm


@pytest.fixture(scope="module")
def squeezenet():
    return models.get("squeezenet1_1", reduced=True)


@pytest.fixture(scope="module")
def plain(squeezenet, tmp_path_factory):
    """A plain program (TVM kernels, opara schedule) and its artifact."""
    exe = paragraph.build(squeezenet, kernels="tvm", schedule="opara")
    path = exe.export_library(tmp_path_factory.mktemp("art") / "plain.paragraph")
    return exe, path


def _merged(mod) -> KernelProgram:
    """The program with every IOS merge the library rule finds applied (disjoint matches)."""
    opgraph = build_program(mod, "llvm").operator_graph
    rule = merge_rule()
    groups, used = [], set()
    for m in rule.find(opgraph):
        units = list(m.extra["units"])
        convs = {c for c, _ in units}
        if not used & convs:
            groups.append(units)
            used |= convs
    merged, added = apply_merges(rule, opgraph, groups)
    assert groups and all(added), (len(groups), added)
    return build_program(merged, "llvm", rewrites=[rule.id] * len(groups))


def test_every_program_kind_reloads_in_a_fresh_process(squeezenet, plain, tmp_path):
    x = random_inputs(squeezenet)
    expected = run_vm(build_program(squeezenet, "llvm").vm(), x)
    # ResNeXt's merged convolution is read through a byte-offset view (`slices_as_views`)
    resnext = models.get("resnext50_32x4d", reduced=True)
    merged = _merged(resnext)
    assert any(n.kind == "view" and "offset" in n.attrs for n in merged.graph.nodes)
    with Session() as session:
        split = split_program(build_program(squeezenet, "llvm", kernels="vendor"), 2, session)
    assert split is not None and any(r.startswith("split-conv") for r in split.rewrites)
    searched = paragraph.build(squeezenet, kernels="vendor",
                               search=paragraph.SearchOptions("greedy", budget=10, top_k=2))
    assert searched.report["search"]["method"] == "greedy"
    xr = random_inputs(resnext)
    cases = {  # name: (executable, input, expected output)
        "plain": (plain[0], x[0], expected[0]),
        "merged": (paragraph.ParallelExecutable(merged, _schedule("wavefront", merged)), xr[0],
                   run_vm(build_program(resnext, "llvm").vm(), xr)[0]),
        "split": (paragraph.ParallelExecutable(split, _schedule("critical-path", split)), x[0],
                  expected[0]),
        "searched": (searched, x[0], expected[0]),
    }
    for name, (exe, xi, want) in cases.items():
        np.testing.assert_allclose(exe.run(xi)[0], want, rtol=1e-4, atol=1e-4, err_msg=name)
        path = exe.export_library(tmp_path / f"{name}.paragraph", info={"kind": name})
        assert is_artifact(path) and read_manifest(path)["info"]["kind"] == name
        np.save(tmp_path / f"{name}-in.npy", xi, allow_pickle=False)
        exe.close()
    script = textwrap.dedent(f"""
        import json, sys
        import numpy as np
        import paragraph
        d = {str(tmp_path)!r}
        for name in {list(cases)!r}:
            exe = paragraph.load(f"{{d}}/{{name}}.paragraph")
            # after the first load: importing it first would import TVM whole
            from paragraph.tvm_interop.runtime.library import native
            x = np.load(f"{{d}}/{{name}}-in.npy", allow_pickle=False)
            np.save(f"{{d}}/{{name}}-out.npy", exe.run(x)[0], allow_pickle=False)
            print(name, json.dumps(exe.schedule.to_json()))
            print("timing", name, native.timing_kernels())
            exe.close()
        # TVM's runtime alone, and no PyTorch module: the C++ vendor kernels load what they call
        print("lean", paragraph.lean.is_runtime_only(), "torch" in sys.modules)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert "lean True False" in lines, lines
    schedules = dict(line.split(" ", 1) for line in lines
                     if not line.startswith(("timing ", "lean ")))
    # the vendor program's kernels start with the forms its build chose (in its manifest):
    # none times its forms, and none packs a weight for a form it will not run
    assert read_manifest(tmp_path / "searched.paragraph")["forms"]
    assert "timing searched 0" in lines, lines
    for name, (exe, _, want) in cases.items():
        got = np.load(tmp_path / f"{name}-out.npy", allow_pickle=False)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)
        assert json.loads(schedules[name]) == exe.schedule.to_json(), name
    manifest = read_manifest(tmp_path / "merged.paragraph")
    assert manifest["rules"] and all(len(r["hash"]) == 64 for r in manifest["rules"])
    assert manifest["tvm"] == tvm.__version__ and manifest["kernels"] == "tvm"
    assert manifest["program"]["views"], "the merged program's views travel with it"
    assert manifest["inputs"][0]["shape"] == list(xr[0].shape)


def _schedule(name, program):
    return plan_schedule(name, program, split=False).schedule


def test_the_executable_checks_its_inputs_and_times(plain):
    exe, _ = plain
    with pytest.raises(InputError, match="takes 1 input"):
        exe.run()
    with pytest.raises(InputError, match="must be float32"):
        exe.run(np.zeros((1, 3, 8, 8), "float32"))
    timing = exe.time(repeat=3)
    assert len(timing.samples) == 3 and timing.median_ms > 0
    assert "opara" in repr(exe)


def _rewrite(src: Path, dst: Path, change) -> Path:
    """Copy the artifact ``src`` to ``dst`` with ``change(name, data) -> data`` applied to each
    member (the manifest is a member too)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            zout.writestr(item.filename, change(item.filename, zin.read(item.filename)))
    return dst


def _manifest_change(**fields):
    def change(name, data):
        if name != "manifest.json":
            return data
        manifest = json.loads(data)
        for key, value in fields.items():
            if isinstance(value, dict):
                manifest[key] = {**manifest[key], **value}
            else:
                manifest[key] = value
        return json.dumps(manifest).encode()
    return change


def test_foreign_truncated_altered_and_stale_files_are_refused(plain, tmp_path):
    _, path = plain
    data = path.read_bytes()
    text = tmp_path / "model.onnx"
    text.write_text("not an artifact")
    with pytest.raises(ArtifactError, match="not a paragraph artifact"):
        paragraph.load(text)
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("hello.txt", "hi")
    with pytest.raises(ArtifactError, match=r"not a paragraph artifact \(no manifest.json\)"):
        paragraph.load(other)
    with pytest.raises(ArtifactError, match="no such file"):
        paragraph.load(tmp_path / "missing.paragraph")
    cut = tmp_path / "cut.paragraph"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match="truncated or damaged"):
        paragraph.load(cut)
    assert not is_artifact(cut)
    flipped = bytearray(data)  # a byte of the stored library: the zip's CRC catches it
    at = data.index(b"ELF")
    flipped[at + 100] ^= 0xFF
    bad = tmp_path / "flipped.paragraph"
    bad.write_bytes(bytes(flipped))
    with pytest.raises(ArtifactError, match="truncated or damaged|cannot be read"):
        paragraph.load(bad)

    def alter(name, member):
        return member.replace(b'"opara"', b'"nimble"') if name == "schedule.json" else member

    with pytest.raises(ArtifactError, match="schedule.json does not match its checksum"):
        paragraph.load(_rewrite(path, tmp_path / "altered.paragraph", alter))
    with pytest.raises(ArtifactError, match="version 0 artifact"):
        paragraph.load(_rewrite(path, tmp_path / "v0.paragraph", _manifest_change(version=0)))
    with pytest.raises(ArtifactError, match="compiled with TVM 0.9.0"):
        paragraph.load(_rewrite(path, tmp_path / "tvm.paragraph",
                                _manifest_change(tvm="0.9.0")))
    with pytest.raises(ArtifactError, match="not a paragraph artifact"):
        paragraph.load(_rewrite(path, tmp_path / "fmt.paragraph",
                                _manifest_change(format="something-else")))
    with pytest.raises(ArtifactError, match="instructions avx9000 this CPU lacks"):
        paragraph.load(_rewrite(path, tmp_path / "flags.paragraph",
                                _manifest_change(cpu_flags=["avx2", "avx9000"])))

    def bad_program(name, member):  # a weight index past the weights, its sum made to match
        if name == "program.json":
            program = json.loads(member)
            next(n for n in program["nodes"] if "weight" in n)["weight"] = 999
            return json.dumps(program).encode()
        if name == "manifest.json":
            manifest = json.loads(member)
            with zipfile.ZipFile(path) as z:
                program = json.loads(z.read("program.json"))
            next(n for n in program["nodes"] if "weight" in n)["weight"] = 999
            data = json.dumps(program).encode()
            manifest["members"]["program.json"] = {"sha256": hashlib.sha256(data).hexdigest(),
                                                   "bytes": len(data)}
            return json.dumps(manifest).encode()
        return member

    with pytest.raises(ArtifactError, match="weight 999 is not one of the"):
        paragraph.load(_rewrite(path, tmp_path / "program.paragraph", bad_program))
    target = read_manifest(path)["target"]
    with pytest.raises(ArtifactError, match="compiled for the CPU 'cortex-a72'"):
        paragraph.load(_rewrite(path, tmp_path / "arm.paragraph", _manifest_change(
            target={**target, "mcpu": "cortex-a72"})))


def test_an_artifact_holds_its_weights_once_and_a_load_holds_them_once(plain, tmp_path):
    """The weights are ``weights.bin``'s raw bytes only (neither the kernel library nor the
    lowered module carries a copy); a loaded program's kernels, graph and VM read the same
    tensors; an altered weight byte is refused by the manifest's checksum."""
    exe, path = plain
    weights = [n.value for n in exe.program.graph.nodes if n.kind == "weight"]
    total = sum(w.nbytes for w in weights)
    biggest = max(weights, key=lambda w: w.nbytes).tobytes()
    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i.filename) for i in z.infolist()}
    assert total * 0.95 <= len(members["weights.bin"]) <= total
    probe = biggest[len(biggest) // 2:len(biggest) // 2 + 96]  # 24 floats from a weight
    assert probe in members["weights.bin"]
    for name in ("kernels.so", "lowered.json"):
        assert probe not in members[name], name
        assert base64.b64encode(biggest[:96]) not in members[name], name
    loaded = paragraph.load(path)
    x = random_inputs(models.get("squeezenet1_1", reduced=True))
    np.testing.assert_allclose(loaded.run(*x)[0], exe.run(*x)[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run_vm(loaded.vm(), x)[0], exe.run(*x)[0], rtol=1e-5,
                               atol=1e-6)
    executor = loaded.executor
    shared = [np.shares_memory(np.from_dlpack(executor.tensors[n.out]), n.value)
              for n in loaded.program.graph.nodes if n.kind == "weight"]
    assert shared and all(shared), "each weight held once: the executor reads the graph's"
    loaded.close()

    def flip(name, data):
        if name != "weights.bin":
            return data
        data = bytearray(data)
        data[len(data) // 2] ^= 0x40
        return bytes(data)

    with pytest.raises(ArtifactError, match="weights.bin does not match its checksum"):
        paragraph.load(_rewrite(path, tmp_path / "weights.paragraph", flip))


def test_a_schedule_that_does_not_fit_the_program_is_refused(plain, squeezenet, tmp_path):
    """A schedule of another program, with a matching checksum, fails the graph check."""
    exe, path = plain
    other = paragraph.build(models.get("randwire", reduced=True), kernels="tvm",
                            schedule="sequential")
    foreign = other.schedule.dumps().encode()

    def swap(name, member):
        if name == "schedule.json":
            return foreign
        if name == "manifest.json":
            m = json.loads(member)
            m["members"]["schedule.json"]["sha256"] = hashlib.sha256(foreign).hexdigest()
            return json.dumps(m).encode()
        return member

    with pytest.raises(ArtifactError, match="schedule or memory plan does not fit"):
        paragraph.load(_rewrite(path, tmp_path / "swapped.paragraph", swap))
    other.close()


def test_export_is_atomic(plain, tmp_path, monkeypatch):
    """An export that fails midway leaves the old file as it was."""
    exe, path = plain
    target = tmp_path / "keep.paragraph"
    target.write_bytes(b"old")

    def boom(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(zipfile.ZipFile, "writestr", boom)
    with pytest.raises(OSError, match="disk full"):
        exe.export_library(target)
    assert target.read_bytes() == b"old"


def _hammer(exe, inputs, refs, runs: int, closer: bool) -> list[str]:
    """Run ``exe`` from one thread per input, ``runs`` times each (and, with ``closer``, close
    it now and then from another thread); the runs whose outputs were not their input's."""
    import threading

    wrong: list[str] = []
    stop = threading.Event()

    def work(t: int) -> None:
        for i in range(runs):
            outs = exe.run(*inputs[t])
            for o, (r, scale) in zip(outs, refs[t], strict=True):
                if not np.allclose(o, r, rtol=1e-4, atol=1e-4 * scale):
                    wrong.append(f"thread {t} run {i}")

    def close_now_and_then() -> None:
        while not stop.wait(0.02):
            exe.close()  # waits for the run in flight; the next run starts the executor again

    threads = [threading.Thread(target=work, args=(t,)) for t in range(len(inputs))]
    closing = threading.Thread(target=close_now_and_then) if closer else None
    for th in threads:
        th.start()
    if closing:
        closing.start()
    for th in threads:
        th.join()
    stop.set()
    if closing:
        closing.join()
    return wrong


@pytest.mark.parametrize("schedule,runs", [("default", 300), ("opara", 1000)])
def test_one_executable_run_from_eight_threads_gives_each_its_own_outputs(squeezenet, plain,
                                                                          schedule, runs):
    """8 threads x 1,000 runs on different inputs (300 on the default one-stream schedule),
    each output equal to its input's reference from TVM's VM (before the executor's lock,
    every thread got other threads' outputs); then again while another thread closes the
    executable now and then."""
    exe = paragraph.build(squeezenet) if schedule == "default" else plain[0]
    inputs = [exe.sample_inputs(seed=s) for s in range(8)]
    vm = exe.vm()
    refs = []
    for x in inputs:
        outs = run_vm(vm, x)
        refs.append([(o, 1 + float(np.abs(o).max())) for o in outs])
    assert not _hammer(exe, inputs, refs, runs, closer=False)
    assert not _hammer(exe, inputs, refs, 100, closer=True)
    exe.close()


def test_weights_taken_out_and_put_back_keep_the_module():
    """`build.weights`: a weight used twice is stored once and comes back as one constant (the
    kernel graph, whose hash a schedule is checked against, has the same nodes: DistilBERT's
    artifact was refused before), small constants stay inline, the VM's form takes the weights
    as parameters, and weights that do not fit the placeholders are refused."""
    import tvm_ffi
    from tvm import relax

    from paragraph.errors import ParagraphError
    from paragraph.tvm_interop.build.weights import lifted, restored, stripped
    from paragraph.tvm_interop.frontend.relax_graph import from_relax

    w = relax.const(np.arange(32, dtype="float32").reshape(4, 8))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.add(x, w))
            b = bb.emit(relax.op.multiply(a, w))
            out = bb.emit_output(relax.op.multiply(b, relax.const(np.float32(2))))
        bb.emit_func_output(out)
    mod = bb.get()
    bare, weights = stripped(mod)
    assert len(weights) == 1  # the shared weight once; the scalar stays in the module
    back = restored(tvm.ir.load_json(tvm.ir.save_json(bare)), weights)
    assert tvm_ffi.structural_equal(back, mod)
    assert [n.kind for n in from_relax(back).nodes] == [n.kind for n in from_relax(mod).nodes]
    vm_form, lifted_weights = lifted(mod)
    assert len(vm_form["main"].params) == 2 and lifted_weights[0].same_as(weights[0])
    with pytest.raises(ParagraphError, match="have no place in the module"):
        restored(tvm.ir.load_json(tvm.ir.save_json(bare)), weights * 2)
    wrong = [tvm.runtime.tensor(np.zeros((8, 4), "float32"))]
    with pytest.raises(ParagraphError, match=r"weight 0 is float32\(8, 4\)"):
        restored(tvm.ir.load_json(tvm.ir.save_json(bare)), wrong)


LEAN_SCRIPT = """
import sys
import numpy as np
import paragraph

exe = paragraph.load(sys.argv[1])  # first: any TVM-facing import before it imports TVM whole
import tvm
from paragraph.tvm_interop.runtime.program import CompilerNeededError
x = np.load(sys.argv[2], allow_pickle=False)
np.save(sys.argv[3], exe.run(x)[0], allow_pickle=False)
# the TVM VM over the artifact's own library: TVM's runtime runs it
np.save(sys.argv[3] + ".vm.npy", exe.vm()["main"](tvm.runtime.tensor(x)).numpy())
print("runtime-only", paragraph.lean.is_runtime_only())
refused = []
for what, ask in [("lowered", lambda: exe.program.lowered),
                  ("target", lambda: exe.program.target),
                  ("export", lambda: exe.export_library(sys.argv[3] + ".again")),
                  ("build", lambda: paragraph.build(sys.argv[1]))]:
    try:
        ask()
    except CompilerNeededError as e:
        assert "PARAGRAPH_LEAN_LOAD=0" in str(e), e
        refused.append(what)
    except paragraph.ParagraphError:  # with the compiler: an artifact is no model to build
        assert what == "build"
print("refused", ",".join(refused))
"""


def test_a_process_that_only_loads_imports_tvms_runtime_alone(plain, squeezenet, tmp_path):
    """`paragraph.load` in a fresh process imports TVM's runtime alone (no compiler, no
    PyTorch): the program runs the same, so does the TVM VM over its library, and what needs
    the compiler says so and how to get it; with ``PARAGRAPH_LEAN_LOAD=0`` (or TVM imported
    first) everything is there."""
    exe, path = plain
    x = random_inputs(squeezenet)[0]
    np.save(tmp_path / "x.npy", x, allow_pickle=False)
    want = exe.run(x)[0]
    script = tmp_path / "lean.py"
    script.write_text(LEAN_SCRIPT)
    for lean in ("1", "0"):
        out = tmp_path / f"out{lean}.npy"
        env = {**os.environ, "PARAGRAPH_LEAN_LOAD": lean}
        run = subprocess.run([sys.executable, str(script), str(path), str(tmp_path / "x.npy"),
                              str(out)], capture_output=True, text=True, timeout=300, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        np.testing.assert_allclose(np.load(out), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.load(str(out) + ".vm.npy"), want, rtol=1e-5, atol=1e-5)
        if lean == "1":
            assert "runtime-only True" in run.stdout
            assert "refused lowered,target,export,build" in run.stdout, run.stdout
        else:
            assert "runtime-only False" in run.stdout
            assert "refused \n" in run.stdout + "\n", run.stdout
            assert is_artifact(tmp_path / "out0.npy.again")


# the index of an own form among the forms of each C++ vendor kernel family (the key's start,
# `native.chosen_forms`), PyTorch's oneDNN or MKL form first where a family has one (forms.h)
_OWN_FORM = {"concat": 1, "conv2d": 2, "conv_avx2_": 1, "conv_kxk": 1, "depthwise": 1,
             "depthwise2": 1, "grouped2_": 1, "linear": 2, "bmm": 1, "softmax": 0,
             "layer_norm": 0, "maxpool": 0, "avgpool3": 0}

TORCH_FREE_SCRIPT = """
import sys
import numpy as np
import paragraph

def torch_mapped():
    return "libtorch_cpu" in open("/proc/self/maps").read()

x = np.load(sys.argv[3], allow_pickle=False)
exe = paragraph.load(sys.argv[1])
np.save(sys.argv[4], exe.run(x)[0], allow_pickle=False)
from paragraph.tvm_interop.runtime.library import native
print("own", native.timing_kernels(), torch_mapped(), "torch" in sys.modules)
exe.close()
# the same kernels with PyTorch's forms chosen: the ATen library loads on their first call
exe = paragraph.load(sys.argv[2])
np.save(sys.argv[4] + ".aten.npy", exe.run(x)[0], allow_pickle=False)
print("aten", native.timing_kernels(), torch_mapped(), "torch" in sys.modules)
"""


def _own_forms(chosen: dict[str, int]) -> dict[str, int]:
    """An own form for every kernel of ``chosen`` (key -> form), by the key's family."""
    own = {}
    for key in chosen:
        family = max((f for f in _OWN_FORM if key.startswith(f)), key=len, default=None)
        assert family is not None, f"no own form known for {key}"
        # the AVX2 pools: PyTorch's form, then the own one
        own[key] = 1 if family in ("maxpool", "avgpool3") and key.endswith("avx2") else \
            _OWN_FORM[family]
    return own


def test_an_artifact_of_own_forms_runs_without_libtorch(squeezenet, tmp_path):
    """The C++ vendor kernels link no libtorch: PyTorch's forms are a library of their own
    (``cpp/aten_forms.cc``), loaded when one first runs. An artifact whose kernels chose own
    forms alone runs in a fresh process without mapping libtorch_cpu (~105 MiB resident), with
    the outputs of its build; one whose kernels chose PyTorch's forms loads it (at their first
    call, from the ATen library) and agrees."""
    from paragraph.machine import cpu_flags
    from paragraph.tvm_interop.runtime.library import native

    if native.module() is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    if not {"avx2", "fma"} <= (cpu_flags() or frozenset()):
        pytest.skip("the own forms need AVX2 and FMA (without them PyTorch's are the only ones)")
    exe = paragraph.build(squeezenet, kernels="vendor", schedule="opara")
    x = random_inputs(squeezenet)[0]
    for _ in range(100):  # until every kernel has timed its forms and chosen one
        exe.run(x)
        if native.timing_kernels() == 0:
            break
    chosen = native.chosen_forms()
    assert chosen and native.timing_kernels() == 0, chosen
    native.choose_forms(_own_forms(chosen))  # what the export records: own forms, whatever won
    path = exe.export_library(tmp_path / "own.paragraph")
    assert read_manifest(path)["forms"] == native.chosen_forms()
    native.choose_forms(dict.fromkeys(chosen, 0))  # each family's first: PyTorch's
    aten = exe.export_library(tmp_path / "aten.paragraph")
    assert set(read_manifest(aten)["forms"].values()) == {0}
    want = exe.run(x)[0]
    exe.close()
    np.save(tmp_path / "x.npy", x, allow_pickle=False)
    script = tmp_path / "torch_free.py"
    script.write_text(TORCH_FREE_SCRIPT)
    out = tmp_path / "out.npy"
    run = subprocess.run([sys.executable, str(script), str(path), str(aten),
                          str(tmp_path / "x.npy"), str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "own 0 False False" in run.stdout, run.stdout
    assert "aten 0 True False" in run.stdout, run.stdout
    np.testing.assert_allclose(np.load(out), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.load(str(out) + ".aten.npy"), want, rtol=1e-4, atol=1e-5)


BUILD_WITHOUT_TORCH_FORMS = """
import sys
import numpy as np
import paragraph
from paragraph import models

mod = models.get("squeezenet1_1", reduced=True)
exe = paragraph.build(mod, kernels="vendor", schedule="opara")
x = exe.sample_inputs()[0]
np.save(sys.argv[2], x, allow_pickle=False)
np.save(sys.argv[3], exe.run(x)[0], allow_pickle=False)
exe.export_library(sys.argv[1])  # after every kernel settled on a form (`_settle_forms`)
from paragraph.tvm_interop.runtime.library import native
maps = open("/proc/self/maps").read()
print("built", native.timing_kernels(), "vendor_aten" in maps, native.revision()[0])
"""


def test_without_torch_forms_a_build_and_its_artifact_need_no_libtorch(tmp_path, fresh_cache):
    """With ``PARAGRAPH_TORCH_FORMS=0`` a kernel with an own form never times PyTorch's: a build
    (in a process of its own, which TVM's FFI gives PyTorch anyway) runs no form of the ATen
    library, and its artifact, in a fresh process, runs without mapping libtorch_cpu and gives
    the build's outputs."""
    from paragraph.machine import cpu_flags
    from paragraph.tvm_interop.runtime.library import native

    if native.module() is None:
        pytest.skip(f"the C++ vendor kernels are unavailable: {native.reason()}")
    if not {"avx2", "fma"} <= (cpu_flags() or frozenset()):
        pytest.skip("the own forms need AVX2 and FMA (without them PyTorch's are the only ones)")
    art, x, want = tmp_path / "own.paragraph", tmp_path / "x.npy", tmp_path / "want.npy"
    env = {**os.environ, "PARAGRAPH_TORCH_FORMS": "0"}
    build = subprocess.run([sys.executable, "-c", BUILD_WITHOUT_TORCH_FORMS, str(art), str(x),
                            str(want)], capture_output=True, text=True, timeout=600, env=env)
    assert build.returncode == 0, build.stderr[-3000:]
    assert "built 0 False o" in build.stdout, build.stdout
    script = tmp_path / "load.py"
    script.write_text(TORCH_FREE_SCRIPT.split("exe.close()")[0])  # the own artifact's half
    out = tmp_path / "out.npy"
    run = subprocess.run([sys.executable, str(script), str(art), "-", str(x), str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "own 0 False False" in run.stdout, run.stdout
    np.testing.assert_allclose(np.load(out), np.load(want), rtol=1e-4, atol=1e-5)
