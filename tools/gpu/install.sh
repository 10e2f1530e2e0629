#!/usr/bin/env bash
# On the GPU machine (see tools/gpu/fetch.sh): step 1 stashes the first piece of the TVM wheel
# and the tvm-ffi wheel, step 2 joins the TVM wheel and installs both into .devsite.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .devstage
case "${1:?usage: install.sh 1|2}" in
  1) cp .devwheels/p1/* .devstage/ ;;
  2) cp .devwheels/p2/* .devstage/
     name=$(cat .devstage/tvm-wheel-name)
     cat .devstage/tvm-part-00 .devstage/tvm-part-01 > ".devstage/$name"
     python3 -m pip install -q --no-index --no-deps --target .devsite ".devstage/$name" \
       .devstage/apache_tvm_ffi-*.whl
     PYTHONPATH=$PWD/.devsite python3 -c "import tvm; print('tvm', tvm.__version__, 'cuda', tvm.cuda(0).exist)" ;;
  *) echo "usage: install.sh 1|2" >&2; exit 2 ;;
esac
