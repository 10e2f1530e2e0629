"""paragraph as TVM passes: the pipeline inside ``tvm.compile`` gives the outputs of TVM's
default build; the registered ``"paragraph"`` pipeline; the passes in a ``Sequential``; the
schedule travels with the module into `paragraph.build`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
import tvm_ffi
from test_importers import symbolic_module  # the same symbolic-shape module
from tvm import relax

import paragraph
from paragraph import models
from paragraph.errors import ParagraphError
from paragraph.tvm_interop.frontend.relax_graph import random_inputs
from paragraph.tvm_interop.runtime.target import local_cpu_target
from paragraph.tvm_interop.runtime.vm import run_vm


@pytest.fixture(scope="module")
def model():
    mod = models.get("squeezenet1_1", reduced=True)
    x = random_inputs(mod)
    target = local_cpu_target()
    expected = run_vm(relax.VirtualMachine(tvm.compile(mod, target), tvm.cpu()), x)
    return mod, x, target, expected


def _vm_outputs(executable, x):
    return run_vm(relax.VirtualMachine(executable, tvm.cpu()), x)


def _close(got, expected):
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernels", ["tvm", "vendor"])
def test_the_pipeline_inside_tvm_compile_equals_the_default_build(model, kernels):
    mod, x, target, expected = model
    executable = tvm.compile(mod, target, relax_pipeline=paragraph.pipeline(kernels=kernels))
    _close(_vm_outputs(executable, x), expected)


def test_the_registered_pipeline(model):
    mod, x, target, expected = model
    paragraph.register_pipelines()
    paragraph.register_pipelines()  # again: no error (TVM refuses a name twice)
    _close(_vm_outputs(tvm.compile(mod, target, relax_pipeline="paragraph"), x), expected)
    seq = relax.get_pipeline("paragraph", kernels="tvm")
    _close(_vm_outputs(tvm.compile(mod, target, relax_pipeline=seq), x), expected)


def test_the_schedule_travels_with_the_module_into_build(model):
    mod, x, target, expected = model
    seq = tvm.transform.Sequential([paragraph.KernelLowering(kernels="vendor"),
                                    paragraph.InterOperatorSchedule("opara")])
    with target:
        scheduled = seq(mod)
    attrs = scheduled["main"].attrs
    assert json.loads(str(attrs["paragraph.schedule"]))["name"] == "opara"
    assert json.loads(str(attrs["paragraph.program"]))["kernels"] == "vendor"
    with paragraph.build(scheduled) as exe:
        assert exe.schedule.name == "opara" and exe.program.sources()["vendor"] > 0
        _close(exe.run(*x), expected)
    # the scheduled module is still a module tvm.compile builds, with the same outputs
    _close(_vm_outputs(tvm.compile(scheduled, target), x), expected)
    # scheduling a scheduled module plans again on the same kernels
    with target:
        again = paragraph.InterOperatorSchedule("sequential")(scheduled)
    assert json.loads(str(again["main"].attrs["paragraph.schedule"]))["name"] == "sequential"


def test_graph_substitution_in_a_pipeline(model):
    """The search as a pass: rewrites by library rule id, outputs equal, inside tvm.compile."""
    mod, x, target, expected = model
    lines: list[str] = []
    with target:
        rewritten = paragraph.GraphSubstitution(paragraph.SearchOptions("greedy", budget=20,
                                                                        top_k=2),
                                                kernels="vendor", log=lines.append)(mod)
    rules = [str(r) for r in rewritten["main"].attrs["paragraph.rewrites"]]
    report = json.loads(str(rewritten["main"].attrs["paragraph.search"]))
    assert report["method"] == "greedy" and report["rules"] == rules
    assert any("round 1" in line for line in lines)
    if rules:  # the search kept a rewrite: the module changed
        assert not tvm_ffi.structural_equal(rewritten, mod)
        lib = paragraph.rules.load_library()
        for r in rules:
            lib.get(r)  # every rewrite is a library rule
    _close(_vm_outputs(tvm.compile(rewritten, target), x), expected)
    # lowering keeps the rules applied, for the artifact's manifest
    with target:
        lowered = paragraph.KernelLowering(kernels="vendor")(rewritten)
    assert json.loads(str(lowered["main"].attrs["paragraph.program"]))["rewrites"] == rules


def test_bad_options_fail_when_the_pass_is_made_or_run(model):
    mod, _, target, _ = model
    with pytest.raises(ParagraphError, match="unknown search 'everything'"):
        paragraph.GraphSubstitution("everything")
    with pytest.raises(ParagraphError, match="unknown schedule 'fastest'"):
        paragraph.InterOperatorSchedule("fastest")
    with pytest.raises(ParagraphError, match="unknown kernel source 'cudnn'"):
        paragraph.pipeline(kernels="cudnn")
    # what only running can find reaches the caller through TVM's FFI, message kept
    with pytest.raises(Exception, match="'data'.*symbolic"), target:
        paragraph.KernelLowering(kernels="tvm")(symbolic_module())
