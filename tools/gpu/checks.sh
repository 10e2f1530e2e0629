#!/usr/bin/env bash
# On the GPU machine after install.sh 2: `checks.sh gpu [SECONDS MODELS]` runs the CUDA tests and
# the GPU executor and search benchmarks (the search limited to SECONDS, over MODELS);
# `checks.sh search SECONDS MODELS` more of the search table; `checks.sh cpu` the peers benchmark
# on the machine's 16 cores; `checks.sh fuzz SECONDS CASES` the fuzzer's CUDA pass (its report is
# written as cases finish, so a time limit keeps what ran). Each step has its own time limit and goes on after a failure; the log
# and JSON results land in $OUT.
set -u
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
out=${OUT:-/tmp/paragraph-gpu}
mkdir -p "$out"
log=$out/log-${1:-gpu}.txt
step() {  # step SECONDS NAME COMMAND...
  local limit=$1 name=$2; shift 2
  echo "== $name: $* ($(date +%T))" | tee -a "$log"
  timeout -k 5 "$limit" "$@" >> "$log" 2>&1
  echo "== $name rc=$? ($(date +%T))" | tee -a "$log"
}
case "${1:-gpu}" in
  gpu)
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc;
      python3 -c "import torch, onnxruntime, cuda.bindings; print(torch.__version__, \
onnxruntime.__version__, torch.cuda.is_available())"; } >> "$log" 2>&1
    step 100 tests python3 -m pytest -q -p no:cacheprovider -rs -k cuda \
      tests/test_executor.py tests/test_vendor.py
    step 100 executor python3 benchmarks/executor.py --target cuda --kernels vendor \
      --models inception_v3,nasnet_a_mobile --json "$out/gpu-executor.json"
    # one model per 300 s on an H100 (2026-11-27): its kernel signatures measured first
    # (NASNet-A mobile's 113 in ~45 s), five searches of 20 s and their loops, the timing
    step "${2:-320}" search python3 benchmarks/search.py --target cuda \
      --models "${3:-nasnet_a_mobile}" \
      --budget 20 --top-k 2 --blocks 5 --time-limit $(( ${2:-320} - 25 )) \
      --json "$out/gpu-search.json" ;;
  search)  # more models for the GPU search table: checks.sh search SECONDS MODELS
    step "${2:-300}" search python3 benchmarks/search.py --target cuda --models "$3" \
      --budget 20 --top-k 2 --blocks 5 --time-limit $(( ${2:-300} - 25 )) \
      --json "$out/gpu-search-more.json" ;;
  fuzz)  # the differential fuzzer on the GPU: checks.sh fuzz SECONDS CASES
    step "${2:-240}" fuzz python3 benchmarks/fuzz.py --target cuda --cases "${3:-300}" \
      --kernels tvm,vendor --timeout 120 --report "$out/gpu-fuzz.json" ;;
  cpu)
    step "${2:-240}" peers python3 benchmarks/peers.py --models inception_v3,nasnet_a_mobile,randwire \
      --blocks 5 --json "$out/peers-cpu-16core.json" ;;
esac
tail -c 9000 "$log"
