#!/usr/bin/env bash
# One call on the GPU machine: configure (Release, sm_90a), build, run the GPU tests (label cuda)
# and the CPU suite, and leave logs under $OUT (or ./gpu-out). Usage: scripts/gpu-check.sh
# The GPU machine has no network: carry .cache/tokenizer (device tool: carry [".cache/tokenizer"])
# or the tokenizer tests fail there for want of tokenizer.json.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0  # the lent machines forbid NVLink multicast
export PATH=/usr/local/cuda/bin:$PATH
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    nvcc --version | tail -2
} >"$out/machine.txt" 2>&1
status=0
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCPFILL_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a >"$out/configure.log" 2>&1 || status=1
if [ $status -eq 0 ]; then
    cmake --build build-gpu -j "$(nproc)" -- -k 0 >"$out/build.log" 2>&1 || status=1
fi
if [ $status -eq 0 ]; then
    ctest --test-dir build-gpu -L cuda --output-on-failure -j 1 >"$out/cuda-tests.log" 2>&1 || status=1
    build-gpu/tests/test_cuda >"$out/cuda-tests-verbose.log" 2>&1 || true
    ctest --test-dir build-gpu -L 'unit|golden' -j "$(nproc)" >"$out/cpu-tests.log" 2>&1 || status=1
fi
tail -n 5 "$out"/*.log
echo "gpu-check: status $status"
exit $status
