#!/usr/bin/env bash
# Sanitizer runs of the CPU tests, lean enough for CI (2 cores, no GPU): a CPU-only build
# (-DCPFILL_CUDA=OFF) at -O1 with line tables, of the test binaries needed and nothing else.
#   scripts/sanitize.sh thread    ThreadSanitizer over the CP/TBO tests (test_parallel), the
#                                 communicators and streams under them (test_runtime) and the
#                                 server's scheduler and HTTP handlers (test_serve)
#   scripts/sanitize.sh address   AddressSanitizer + UndefinedBehaviorSanitizer over every unit test
#                                 (label unit; test_tools runs an instrumented cpfill)
# Any report fails the run. Build folders: build-tsan, build-asan.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/sanitize.sh thread|address}
case $kind in
thread)
    dir=build-tsan
    san="-fsanitize=thread"
    targets=(test_runtime test_parallel test_serve)
    ;;
address)
    dir=build-asan
    san="-fsanitize=address,undefined -fno-sanitize-recover=all"
    targets=(test_core test_io test_runtime test_ops test_model test_parallel test_engine
             test_serve test_tools cpfill)
    ;;
*)
    echo "scripts/sanitize.sh: expected thread or address, found '$kind'" >&2
    exit 2
    ;;
esac
jobs=$(nproc)
# CMAKE_BUILD_TYPE=Sanitize has no flags of its own: CMAKE_CXX_FLAGS are all there is.
cmake -S . -B "$dir" -G Ninja -DCPFILL_CUDA=OFF -DCMAKE_BUILD_TYPE=Sanitize \
    -DCMAKE_CXX_FLAGS="-O1 -g1 -fno-omit-frame-pointer $san" \
    -DCMAKE_EXE_LINKER_FLAGS="$san" ${CPFILL_CMAKE_ARGS:-} >/dev/null
cmake --build "$dir" -j "$jobs" --target "${targets[@]}"

export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp"
if [ "$kind" = thread ]; then
    "$dir/tests/test_runtime"
    "$dir/tests/test_parallel"
    "$dir/tests/test_serve"
else
    # CpuEstimateFollowsTheMeasuredGrowth compares the peak RSS with cpu_prefill_bytes, which
    # AddressSanitizer's shadow memory and quarantine inflate: left out here.
    ctest --test-dir "$dir" --output-on-failure -j "$jobs" -L unit \
        -E '^CliMemory\.CpuEstimateFollowsTheMeasuredGrowth$'
fi
