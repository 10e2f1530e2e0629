"""Vendor kernels: convolutions and matrix products through the libraries PyTorch ships.

By job: `names` (a call's `VendorOp` and function name), `runtime` (the PyTorch kernels behind
the names), `native` (the CPU convolutions and products in C++, which the native stream runner
calls without the GIL), `dispatch` (the Relax pass that makes the calls, and back), `select`
(``--kernels auto``: the faster source per call, measured).

The TVM wheel has neither cuDNN nor cuBLAS, so paragraph reaches vendor libraries the way TVM's
own BYOC backends do (``relax.backend.cuda.cudnn.partition_for_cudnn``): a Relax pass,
`VendorDispatch`, replaces matched operator patterns with ``R.call_dps_packed`` calls to global
functions that paragraph registers under ``paragraph.vendor.``, and those functions run the
kernels with PyTorch (oneDNN and MKL on the CPU, cuDNN and cuBLAS on CUDA) on the TVM tensors
themselves (DLPack, no copy in or out).

Patterns (after `importers.prepare`, batch norm is a chain of per-channel constant ops):

* ``conv2d(x, W)`` with a constant weight, then any chain of per-output-channel constant
  ``add``/``subtract``/``multiply``/``divide`` (folded into the weight and a bias, in numpy),
  then optionally a residual ``add`` of a tensor of the output's shape, then optionally ``relu``;
* ``matmul(a, B)`` with a 2-D ``B`` (``linear``), then optionally a constant bias ``add`` and a
  ``relu``/``gelu``/``gelu_tanh``; and batched ``matmul`` of equal-rank operands (``bmm``);
* on the CPU, ``concat`` of static-shape tensors (a concat of a concat along the same axis,
  read only there, is flattened into one), then optionally ``relu``: ``torch.cat(out=)`` copied
  an Inception block's channels 6x faster than TVM's untuned concatenate kernel, which sits on
  the critical path of every block;
* on the CPU, ``softmax`` of a static-shape tensor (``aten._softmax.out``: an attention's
  12x128x128 scores in 0.13 ms against 0.7 ms for TVM's untuned kernel);
* on the CPU, max and average pools of static NHWC tensors (symmetric padding, no dilation,
  floor rounding); an average pool then takes any chain of per-channel constant ``add``/
  ``subtract``/``multiply``/``divide`` (folded into a per-channel scale and shift, in numpy) and
  a ``relu`` as its epilogue: where the critical-path planner moved a pool after its 1 x 1
  convolution (rule ``pool-after-conv1x1``) the convolution's batch norm and relu follow it;
* the erf form of GELU that PyTorch exports to ONNX, ``x * (1 + erf(x / sqrt 2)) * 0.5`` in any
  order of the products, after a vendor matmul: that matmul's exact ``gelu``.

The kernels apply more activations than the pass fuses today: every convolution and product
takes any of `names.EPILOGUES` (``relu``, ``relu6``, ``hardswish``, ``hardsigmoid``,
``sigmoid``, ``silu``, ``gelu``, ``gelu_tanh``; the C++ kernels' own forms in their epilogue, in
registers), a concat and an average pool ``relu`` alone.

What a call needs beyond its tensors (strides, padding, fused ops, layout) is in the function
name, e.g. ``paragraph.vendor.conv2d.NHWC.s2x2.p1x1.d1x1.g1.bias.relu``; `ensure_registered`
turns any such name back into a kernel, so a compiled program can be loaded in a fresh process.

CPU. Convolutions run in NHWC: oneDNN's NCHW convolutions reorder every activation and were
1.6x slower on this machine (notes/measured.md), so the pass first puts the graph in NHWC with
TVM's ``ConvertLayout`` (weights are transposed once, at compile time). A convolution writes
straight into the output buffer with oneDNN's in-place "add" post-op (the buffer is zeroed first,
or holds the residual: torch has no ``out=`` convolution that does not allocate and copy), with
its weight reordered once into oneDNN's blocked format and cached under the weight's digest,
which the function name carries. A product with a constant matrix runs the same way, as a 1x1
convolution (oneDNN's GEMM was 2.5x faster than MKL's on this AMD CPU); other products use
MKL's ``out=`` forms.
Where a convolution is a GEMM (1x1, stride 1, unpadded, ungrouped, in NHWC) and for a product
with a constant matrix, the bound call has a second form, MKL's GEMM written in place (bias,
residual and activation after it): oneDNN's in-place call costs about 24 us before any work,
MKL's 3 us, so small ones run faster as GEMMs and large ones on oneDNN; the first calls on
each thread count time both and keep the faster (`runtime._Fastest`).
On the CPU the executor binds convolutions and products with a constant matrix to their C++
forms (`native.bind`, the same PyTorch calls from ``cpp/aten_forms.cc``): a Python vendor call
takes the GIL twice, and on two concurrent streams small kernels queued for it (RandWire's
streams were busy 40% longer than their kernels alone; in C++ they are not). Concatenations,
softmax and batched products, and the TVM VM's calls, stay in Python.
The executor binds each kernel to its tensors once (`runtime.bind`):
the torch views (DLPack, layout permutes) are made then, not on every call. Each call sets
torch's thread count for the calling thread to the one the executor gave its stream
(``torch.set_num_threads`` is per thread for OpenMP and MKL). paragraph sets
``GOMP_SPINCOUNT=300000`` unless the user chose (it must be set before torch loads; see
``paragraph/__init__.py``): an idle OpenMP worker spins up to about 3 ms before it sleeps,
which spans the gap between one stream's calls, where a sleeping worker costs every 2-thread
call a wake-up (45-80 us). It measured faster than the 3000 chosen before on five one-stream
models, idle and with another process on a core (``benchmarks/spin.py``). libgomp spins only
while the process's OpenMP threads fit the cores (beyond, 100 times), and a thread that ran a
2-thread region keeps its team for life, so the executor runs a one-stream schedule on the
calling thread (`executor`). Small kernels avoid the
wake-up too: a schedule's ``kernel_threads`` runs them on one thread
(`planner.fewer_threads_where_faster`).

CUDA. Calls run on the stream TVM's kernels use at that moment (the executor sets it per
schedule stream), through ``torch.cuda.ExternalStream``. cuDNN convolutions return a new tensor,
copied into the output together with the activation; cuBLAS products write in place. CUDA Graph
capture relies on the executor issuing every kernel once before capturing: cuDNN/cuBLAS
workspaces and the convolution results then come from torch's caching allocator without a
``cudaMalloc`` during capture (do not call ``torch.cuda.empty_cache()`` while a captured
executor lives: the graph keeps using those blocks).
"""
