#!/usr/bin/env bash
# Here (no GPU): download the TVM wheels the GPU machine lacks and cut them into pieces that
# fit one device call each (64 MiB travel per call). Then, on the device:
#   call 1: carry .devwheels/p1, run `bash tools/gpu/install.sh 1`
#   call 2: carry .devwheels/p2, run `bash tools/gpu/install.sh 2`
#   later calls: export PYTHONPATH=$PWD/.devsite:$PWD  (then e.g. `make gpu-check`)
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .devwheels && mkdir -p .devwheels/p1 .devwheels/p2 .devwheels/all
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .devwheels/all \
  apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1
tvm=$(ls .devwheels/all/apache_tvm-*.whl)
split -n 2 -d "$tvm" ".devwheels/tvm-part-"
mv .devwheels/tvm-part-00 .devwheels/p1/ && mv .devwheels/all/apache_tvm_ffi-*.whl .devwheels/p1/
mv .devwheels/tvm-part-01 .devwheels/p2/
basename "$tvm" > .devwheels/p1/tvm-wheel-name
rm -rf .devwheels/all
du -sh .devwheels/p1 .devwheels/p2
