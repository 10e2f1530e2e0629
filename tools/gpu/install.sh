#!/usr/bin/env bash
# On the GPU machine (see tools/gpu/fetch.sh): step 1 installs tvm-ffi and z3 into .devsite and
# stashes the first piece of TVM; step 2 joins TVM's pieces, unpacks it there and checks that TVM
# sees the GPU. Both paths are git-ignored, so they stay between calls while the machine is warm.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .devstage .devsite
case "${1:?usage: install.sh 1|2}" in
  1) cp .devwheels/p1/tvm.tar.xz.part-* .devstage/
     python3 -m pip install -q --no-index --no-deps --no-compile --target .devsite \
       .devwheels/p1/apache_tvm_ffi-*.whl
     xz -dc .devwheels/p1/z3.tar.xz | tar -xf - -C .devsite ;;
  2) cat .devstage/tvm.tar.xz.part-00 .devwheels/p2/tvm.tar.xz.part-01 | xz -dc -T0 \
       | tar -xf - -C .devsite
     source tools/gpu/env.sh
     python3 -c "import tvm, z3; print('tvm', tvm.__version__, 'cuda', tvm.cuda(0).exist, \
tvm.cuda(0).compute_version)" ;;
  *) echo "usage: install.sh 1|2" >&2; exit 2 ;;
esac
