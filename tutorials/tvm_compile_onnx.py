"""Put paragraph into an existing ``tvm.compile`` flow for an ONNX model.

Run it with ``python tutorials/tvm_compile_onnx.py`` (needs the onnx and torch extras, which
``make`` installs). A TVM user's flow is: import the ONNX model with TVM's frontend, compile it
with ``tvm.compile``, run it on the Relax VM. paragraph joins it in one of three ways:

1. ``relax_pipeline=paragraph.pipeline()``: the same VM, with paragraph's graph-level gains
   (fusion, vendor kernels, and with ``search=`` the verified substitutions);
2. ``paragraph.register_pipelines()``: the same, by name (``relax_pipeline="paragraph"``);
3. the passes in a ``tvm.transform.Sequential`` ending in ``InterOperatorSchedule``, then
   ``paragraph.build``: the parallel executor runs independent kernels side by side.
"""

from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

import paragraph
from paragraph.timing import time_calls
from paragraph.tvm_interop.runtime.target import local_cpu_target
from paragraph.tvm_interop.runtime.vm import run_vm


def inception_block_onnx(path: Path, channels: int) -> None:
    """An Inception-style block (four branches over one input, concatenated) as ONNX."""
    import torch  # optional extra: the model is written and exported with PyTorch

    def conv(cin: int, cout: int, k: int) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Conv2d(cin, cout, k, padding=k // 2),
                                   torch.nn.ReLU())

    class Block(torch.nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.b1 = conv(c, c, 1)
            self.b3 = torch.nn.Sequential(conv(c, c, 1), conv(c, c, 3))
            self.b5 = torch.nn.Sequential(conv(c, c, 1), conv(c, c, 5))
            self.pool = torch.nn.Sequential(torch.nn.AvgPool2d(3, 1, 1), conv(c, c, 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([self.b1(x), self.b3(x), self.b5(x), self.pool(x)], 1)

    torch.manual_seed(0)
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(Block(channels).eval(), (torch.randn(1, channels, 17, 17),),
                          str(path), input_names=["image"], dynamo=False)


def main(full: bool = False) -> None:
    import onnx  # optional extra: TVM's ONNX frontend reads onnx models
    from tvm.relax.frontend.onnx import from_onnx

    channels = 64 if full else 16
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "block.onnx"
        inception_block_onnx(path, channels)
        # The usual TVM import: a Relax module with the weights as constants.
        mod = from_onnx(onnx.load(str(path)), shape_dict={"image": [1, channels, 17, 17]})
    target = local_cpu_target()
    x = [np.random.default_rng(0).standard_normal((1, channels, 17, 17)).astype("float32")]

    # TVM's own build: the baseline (on a CPU its default pipeline does not fuse).
    vm = relax.VirtualMachine(tvm.compile(mod, target), tvm.cpu())
    expected = run_vm(vm, x)
    baseline = time_calls(lambda: run_vm(vm, x), 20, warmup=3).median_ms

    # 1. paragraph's pipeline inside tvm.compile: fused kernels, vendor ones where torch is
    #    installed (kernels="tvm" keeps TVM's own code generation for every kernel).
    vm1 = relax.VirtualMachine(tvm.compile(mod, target, relax_pipeline=paragraph.pipeline()),
                               tvm.cpu())
    got = run_vm(vm1, x)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=1e-4)
    with_pipeline = time_calls(lambda: run_vm(vm1, x), 20, warmup=3).median_ms

    # 2. By name, for code that takes a pipeline name.
    paragraph.register_pipelines()
    vm2 = relax.VirtualMachine(tvm.compile(mod, target, relax_pipeline="paragraph"), tvm.cpu())
    np.testing.assert_allclose(run_vm(vm2, x)[0], expected[0], rtol=1e-4, atol=1e-4)

    # 3. The passes, then the parallel executor. The schedule is an attribute of main, so the
    #    module could be saved (tvm.ir.save_json) and built elsewhere under the same schedule.
    seq = tvm.transform.Sequential([paragraph.KernelLowering(),
                                    paragraph.InterOperatorSchedule("critical-path")])
    with target:
        scheduled = seq(mod)
    with paragraph.build(scheduled, target) as exe:
        np.testing.assert_allclose(exe.run(*x)[0], expected[0], rtol=1e-4, atol=1e-4)
        parallel = exe.time(*x, repeat=20).median_ms
        schedule = exe.schedule.describe()

    print(f"TVM default build, VM:         {baseline:7.3f} ms")
    print(f"paragraph.pipeline(), VM:      {with_pipeline:7.3f} ms")
    print(f"paragraph.build, {schedule}: {parallel:.3f} ms")


if __name__ == "__main__":
    main(full="--full" in sys.argv)
