#!/usr/bin/env bash
# On the GPU machine: builds only what tests/cuda/test_attention_tc_cuda.cpp needs (the two
# attention kernels, the CPU reference, buffers and device queries; not the whole tree), runs its
# tests, the rates of attention_tc and attention_wg on 16k-query CSA- and HCA-like shapes, then
# compute-sanitizer (memcheck, racecheck) on small cases where it works. Logs go to $OUT (or
# ./attention-tc-out).
# Usage: scripts/attention-tc-check.sh   (BUILD=dir for the objects, default
# /tmp/attention-tc-build; JOBS=n parallel compiles, default all cores; RATES_ONLY=1 runs the rates
# and nothing else, e.g. for a baseline kernel in the same run; TEST_TIMEOUT=s stops a hung kernel,
# default 180)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-attention-tc-out}
build=${BUILD:-/tmp/attention-tc-build}
mkdir -p "$out" "$build"
# shellcheck source=scripts/partial-build.sh
. scripts/partial-build.sh  # cxx_flags, cu_flags, compile, partial_build_machine, clock_summary
partial_build_machine "$out/machine.txt"
cpp_srcs=(src/core/dtype.cpp src/core/error.cpp src/core/parallel.cpp src/ops/cpu/linear.cpp
          src/ops/cpu/attention.cpp src/ops/cpu/norm.cpp src/ops/cpu/rope.cpp
          tests/cuda/test_attention_tc_cuda.cpp)
cu_srcs=(src/ops/cuda/attention.cu src/ops/cuda/attention_tc.cu src/ops/cuda/attention_wg.cu
         src/ops/cuda/norm.cu src/ops/cuda/rope.cu src/runtime/cuda/buffer.cu
         src/runtime/cuda/device.cu src/runtime/cuda/sm90.cu)

# Compile in parallel (compile_sources, scripts/partial-build.sh), one log per file; the test file
# (ours) also with -Werror.
objs=()
compile_sources
wait
cat "$build"/*.o.log >"$out/build.log"
for o in "${objs[@]}"; do
    [ -e "$o.ok" ] || { tail -n 40 "$out/build.log"; echo "attention-tc-check: build failed"; exit 1; }
done
g++ -o "$build/test_attention_tc" "${objs[@]}" -L/usr/local/cuda/lib64 -lcudart -lgtest \
    -lgtest_main -lfmt -lopenblas -lpthread >>"$out/build.log" 2>&1 ||
    { tail -n 20 "$out/build.log"; echo "attention-tc-check: link failed"; exit 1; }
grep -E "registers|spill" "$build/attention_tc.cu.o.log" "$build/attention_wg.cu.o.log" || true

cuobjdump --dump-sass "$build/attention_tc.cu.o" | grep -c HMMA | sed 's/^/HMMA instructions: /' || true
cuobjdump --dump-sass "$build/attention_wg.cu.o" | grep -c HGMMA | sed 's/^/HGMMA instructions: /' ||
    true

status=0
rates_only=${RATES_ONLY:-0}
if [ "$rates_only" != 1 ]; then
    timeout "${TEST_TIMEOUT:-180}" "$build/test_attention_tc" >"$out/tests.log" 2>&1 || status=1
    grep -E "^\[  (PASSED|FAILED) |tests ran|Failure" "$out/tests.log" | head -n 40 || true
fi

# The rates, with the SM clock and power sampled alongside (GPU 0, the one the test uses).
nvidia-smi -i 0 --query-gpu=clocks.sm,power.draw --format=csv,noheader -lms 250 \
    >"$out/clocks.log" 2>&1 &
smi=$!
timeout "${TEST_TIMEOUT:-180}" "$build/test_attention_tc" --gtest_also_run_disabled_tests \
    --gtest_filter='CudaAttentionTcRate.*' \
    >"$out/rates.log" 2>&1 || status=1
kill "$smi" 2>/dev/null || true
clock_summary "$out/clocks.log"
grep -E "^\[ (rate|error) \]|beyond|FAILED" "$out/rates.log" || true

# Last, as it may not work on every machine: bad accesses and shared-memory races, small cases,
# skipped when the script has run 2 minutes already (SANITIZE=0 skips, 1 forces).
sanitize=${SANITIZE:-auto}
[ "$rates_only" = 1 ] && sanitize=0
[ "$sanitize" = auto ] && { ((SECONDS < 120)) && sanitize=1 || sanitize=0; }
echo "${SECONDS}s so far; sanitizer: $sanitize"
if [ "$sanitize" = 1 ] && command -v compute-sanitizer >/dev/null; then
    # 8h_sliding_300q: more items than multiprocessors, so blocks go from item to item
    small='Grid/CudaAttentionTc.MatchesCpu/24h_csa_small_37q:Grid/CudaAttentionTc.MatchesCpu/8h_sliding_300q'
    timeout 45 compute-sanitizer --tool memcheck "$build/test_attention_tc" \
        --gtest_filter="$small:Edges/CudaAttentionTc.MatchesCpu/80h_csa_37q" \
        >"$out/sanitizer-memcheck.log" 2>&1 || echo "memcheck: non-zero exit (see its log)"
    timeout 45 compute-sanitizer --tool racecheck "$build/test_attention_tc" \
        --gtest_filter="$small" >"$out/sanitizer-racecheck.log" 2>&1 ||
        echo "racecheck: non-zero exit (see its log)"
    tail -n 2 "$out"/sanitizer-*.log
fi
echo "attention-tc-check: status $status"
exit $status
