#!/usr/bin/env bash
# Diagnoses the GPU fault path on the GPU machine: builds cpfill, runs one CP = 2 prefill with a
# rank failing at layer 1 (`--inject-fault-rank`), and if it is still running after DIAG_WAIT
# seconds dumps every thread's stack (gdb or cuda-gdb, when present) before killing it. Logs under $OUT.
#   DIAG_TBO=off|on  DIAG_FAILING=1|0  DIAG_WAIT=15
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 PATH=/usr/local/cuda/bin:$PATH
if [ ! -x build-gpu/cpfill ]; then
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCPFILL_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90a >"$out/configure.log" 2>&1 &&
        cmake --build build-gpu -j "$(nproc)" --target cpfill >"$out/build.log" 2>&1 ||
        { echo "build failed"; tail -30 "$out/build.log"; exit 1; }
fi
log="$out/fault-${DIAG_TBO:-off}-${DIAG_FAILING:-1}.log"
model=tests/data/dsv4_tiny_a
NCCL_DEBUG=${NCCL_DEBUG:-WARN} build-gpu/cpfill run --model $model \
    --input-ids-file $model/reference.safetensors --device cuda --cp 2 --tbo "${DIAG_TBO:-off}" \
    --inject-fault-rank "${DIAG_FAILING:-1}" >"$log" 2>&1 &
pid=$!
for _ in $(seq "${DIAG_WAIT:-15}"); do
    sleep 1
    kill -0 $pid 2>/dev/null || break
done
if kill -0 $pid 2>/dev/null; then
    echo "still running after ${DIAG_WAIT:-15} s: stacks" | tee -a "$log"
    gdb=$(command -v gdb || command -v cuda-gdb)
    if [ -n "$gdb" ]; then
        "$gdb" -p $pid -batch -ex "thread apply all bt 25" >>"$log" 2>&1
    else
        for t in /proc/$pid/task/*; do
            echo "== $t $(cat "$t/comm") wchan=$(cat "$t/wchan")"
            cat "$t/stack" 2>/dev/null | head -8
        done >>"$log"
    fi
    kill -9 $pid
fi
wait $pid
echo "exit $?" | tee -a "$log"
tail -c 20000 "$log"
