#!/usr/bin/env bash
# On the GPU machine: builds only what tests/cuda/test_indexer_cuda.cpp needs (the indexer kernels,
# the CPU reference, buffers and device queries; not the whole tree), runs its tests, the timing
# of one CSA layer's indexer at 64k and 128k tokens (scoring rate and top-k time apart), then
# compute-sanitizer (memcheck, racecheck) on small cases and Nsight Compute on one scoring and one
# top-k kernel of the 64k case, each where time is left. BASELINE=file.cu also builds the test
# against another indexer.cu (say, `git show HEAD:src/ops/cuda/indexer.cu`) and times that one
# too, for a before/after. Logs go to $OUT (or ./indexer-out).
# Usage: scripts/indexer-check.sh   (BUILD=dir for the objects, default /tmp/indexer-build;
# JOBS=n parallel compiles, default all cores; SANITIZE and PROFILE: 0 skips, 1 forces)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-indexer-out}
build=${BUILD:-/tmp/indexer-build}
mkdir -p "$out" "$build"
# shellcheck source=scripts/partial-build.sh
. scripts/partial-build.sh  # cxx_flags, cu_flags, compile, partial_build_machine, clock_summary
partial_build_machine "$out/machine.txt"
cpp_srcs=(src/core/dtype.cpp src/core/error.cpp src/core/parallel.cpp src/ops/cpu/linear.cpp
          src/ops/cpu/indexer.cpp tests/cuda/test_indexer_cuda.cpp)
cu_srcs=(src/runtime/cuda/buffer.cu src/runtime/cuda/device.cu src/runtime/cuda/sm90.cu
         src/ops/cuda/indexer_hopper.cu src/ops/cuda/tensor_map.cu)

# Compile in parallel (compile_sources, scripts/partial-build.sh), one log per file; the test file
# and the indexer (ours) also with -Werror.
objs=()
compile_sources
compile "$build/indexer.o" nvcc "${cu_flags[@]}" -Werror=all-warnings -c src/ops/cuda/indexer.cu \
    -o "$build/indexer.o"
base=${BASELINE:-}
[ -n "$base" ] && compile "$build/indexer_base.o" nvcc "${cu_flags[@]}" -c "$base" \
    -o "$build/indexer_base.o"
wait
cat "$build"/*.o.log >"$out/build.log"
for o in "${objs[@]}" "$build/indexer.o" ${base:+"$build/indexer_base.o"}; do
    [ -e "$o.ok" ] || { tail -n 40 "$out/build.log"; echo "indexer-check: build failed"; exit 1; }
done
link() {  # link <binary> <indexer object>
    g++ -o "$1" "${objs[@]}" "$2" -L/usr/local/cuda/lib64 -lcudart -lgtest -lgtest_main -lfmt \
        -lopenblas -lpthread >>"$out/build.log" 2>&1 ||
        { tail -n 20 "$out/build.log"; echo "indexer-check: link failed"; exit 1; }
}
link "$build/test_indexer" "$build/indexer.o"
[ -n "$base" ] && link "$build/test_indexer_base" "$build/indexer_base.o"
grep -E "registers|spill" "$build/indexer.o.log" || true
cuobjdump --dump-sass "$build/indexer.o" >"$out/indexer.sass" 2>&1 || true
grep -c HMMA "$out/indexer.sass" | sed 's/^/HMMA instructions: /' || true

status=0
timeout 150 "$build/test_indexer" >"$out/tests.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED) |tests ran|Failure|near-tie|\[ timing \]" "$out/tests.log" |
    head -n 40 || true

# The timings, with the SM clock and power sampled alongside (GPU 0, the one the test uses).
nvidia-smi -i 0 --query-gpu=clocks.sm,power.draw --format=csv,noheader -lms 250 \
    >"$out/clocks.log" 2>&1 &
smi=$!
timing() {  # timing <binary> <log>
    "$1" --gtest_also_run_disabled_tests --gtest_filter='CudaIndexerTiming.*' >"$2" 2>&1 ||
        status=1
    grep -E "^\[ timing \]|Failure|FAILED|expected|Which is" "$2" || true
}
echo "after:"
timing "$build/test_indexer" "$out/timing.log"
if [ -n "$base" ]; then
    echo "before (BASELINE=$base):"
    timing "$build/test_indexer_base" "$out/timing-base.log"
fi
kill "$smi" 2>/dev/null || true
clock_summary "$out/clocks.log"

# Last, as it may not work on every machine: bad accesses and shared-memory races on small cases,
# skipped when the script has run 120 s already.
sanitize=${SANITIZE:-auto}
[ "$sanitize" = auto ] && { ((SECONDS < 120)) && sanitize=1 || sanitize=0; }
echo "${SECONDS}s so far; sanitizer: $sanitize"
if [ "$sanitize" = 1 ] && command -v compute-sanitizer >/dev/null; then
    small='Cases/CudaIndexer.SelectsTheCpuSet/1:Cases/CudaIndexer.SelectsTheCpuSet/8'
    small_race='Cases/CudaIndexer.SelectsTheCpuSet/1:Cases/CudaIndexer.SelectsTheCpuSet/7'
    timeout 40 compute-sanitizer --tool memcheck "$build/test_indexer" --gtest_filter="$small" \
        >"$out/sanitizer-memcheck.log" 2>&1 || echo "memcheck: non-zero exit (see its log)"
    timeout 40 compute-sanitizer --tool racecheck "$build/test_indexer" \
        --gtest_filter="$small_race" >"$out/sanitizer-racecheck.log" \
        2>&1 || echo "racecheck: non-zero exit (see its log)"
    tail -n 2 "$out"/sanitizer-*.log
fi

# Hardware counters of chunk 12's scoring and top-k kernels at 64k (launches 24 and 25), where the
# script has run less than 170 s (the clocks left alone).
profile=${PROFILE:-auto}
[ "$profile" = auto ] && { ((SECONDS < 170)) && profile=1 || profile=0; }
ncu=$(gpu_ncu)
echo "${SECONDS}s so far; profile: $profile (${ncu:-no ncu})"
if [ "$profile" = 1 ] && [ -n "$ncu" ]; then
    timeout 60 "$ncu" --clock-control none --kernel-name regex:'score_kernel|topk_kernel' \
        --launch-skip 24 --launch-count 2 --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section WarpStateStats --section Occupancy "$build/test_indexer" \
        --gtest_also_run_disabled_tests --gtest_filter='CudaIndexerTiming.DISABLED_Context64k' \
        >"$out/ncu.log" 2>&1 || echo "ncu: non-zero exit (see its log)"
    grep -E "_kernel|Duration|Throughput|highest-utilized|Issue Slots|Achieved Occ|Cycles Per Issued" \
        "$out/ncu.log" | head -n 40 || true
fi
echo "indexer-check: status $status"
exit $status
