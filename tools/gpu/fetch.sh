#!/usr/bin/env bash
# Here (no GPU needed): pack what the GPU machine lacks (TVM, tvm-ffi, z3; its image has Python
# 3.12 with PyTorch, ONNX Runtime, cuda-bindings) into two pieces that fit one device call each
# (64 MiB travel per call, the repository included). TVM's wheel is 100 MB; its files recompressed
# with xz (without the CUTLASS headers, which nothing here compiles against) are 62 MB.
#   call 1: carry .devwheels/p1, run `bash tools/gpu/install.sh 1`
#   call 2 (within the 30 s the machine stays warm): carry .devwheels/p2, run
#           `bash tools/gpu/install.sh 2 && bash tools/gpu/checks.sh gpu`
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$work" \
  apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1 z3-solver==5.4.0.0
rm -rf .devwheels && mkdir -p .devwheels/p1 .devwheels/p2
(mkdir "$work/tvm" && cd "$work/tvm" && unzip -q "$work"/apache_tvm-*.whl \
  && tar --exclude=tvm/3rdparty -cf - tvm apache_tvm-*.dist-info | xz -9e -T0 > "$work/tvm.tar.xz")
# z3's wheel holds libz3.so twice (with and without its version) and its C headers: one will do
(mkdir "$work/z3" && cd "$work/z3" && unzip -q "$work"/z3_solver-*.whl \
  && rm -rf z3/include z3/lib/libz3.so.* && tar -cf - z3 z3_solver-*.dist-info | xz -9 > "$work/z3.tar.xz")
split -b 45M -d "$work/tvm.tar.xz" .devwheels/tvm.tar.xz.part-
mv .devwheels/tvm.tar.xz.part-00 "$work/z3.tar.xz" "$work"/apache_tvm_ffi-*.whl .devwheels/p1/
mv .devwheels/tvm.tar.xz.part-01 .devwheels/p2/
du -sh .devwheels/p1 .devwheels/p2
