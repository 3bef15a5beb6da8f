#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/fuzz_*.cpp) with clang in a build folder of their own and
# runs each for SECONDS seconds, starting from a small seed corpus written here. Fails if any
# fuzzer finds a crash (libFuzzer exits non-zero; the reproducer is kept in the artifacts folder).
# Usage: scripts/fuzz.sh [SECONDS]   (default 60; build folder build-fuzz, or $CPFILL_FUZZ_BUILD)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
build=${CPFILL_FUZZ_BUILD:-build-fuzz}

if [ -f "$build/CMakeCache.txt" ] && ! grep -q '^CMAKE_CXX_COMPILER:.*clang++' "$build/CMakeCache.txt"; then
    echo "fuzz: $build was configured with another compiler; remove it and run again" >&2
    exit 1
fi
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCPFILL_FUZZ=ON -DCPFILL_CUDA=OFF -DCPFILL_TESTS=ON >/dev/null
# Keep going past a fuzzer that does not compile, so the others still run; it fails the script below.
# Old binaries are removed first so that a failed build cannot leave a stale one to be run.
rm -f "$build"/tests/fuzz/fuzz_*
cmake --build "$build" --target cpfill_fuzzers -j "$(nproc)" -- -k 0 || true

# Seeds, rewritten on every run. fuzz_safetensors_header reads 8 bytes of data-area size (little
# endian) and then the header text; the other fuzzers read JSON text.
seeds=$build/fuzz-seeds
rm -rf "$seeds"
mkdir -p "$seeds/fuzz_safetensors_header" "$seeds/default"
printf '\x10\x00\x00\x00\x00\x00\x00\x00%s' \
    '{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"__metadata__":{"format":"pt"}}' \
    >"$seeds/fuzz_safetensors_header/valid"
printf '\x00\x00\x00\x00\x00\x00\x00\x00{}' >"$seeds/fuzz_safetensors_header/empty"
printf '{}' >"$seeds/default/empty"
printf '{"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 128}' >"$seeds/default/small"
cat >"$seeds/json.dict" <<'DICT'
"{"
"}"
"["
"]"
":"
","
"\""
"null"
"true"
"-1"
"1e9"
"18446744073709551615"
"\"dtype\""
"\"shape\""
"\"data_offsets\""
"\"__metadata__\""
"\"F32\""
"\"BF16\""
"\"F8_E4M3\""
"\"F8_E8M0\""
"\"I64\""
DICT

status=0
for src in tests/fuzz/fuzz_*.cpp; do
    name=$(basename "$src" .cpp)
    bin=$build/tests/fuzz/$name
    if [ ! -x "$bin" ]; then
        echo "fuzz: $name FAILED to build" >&2
        status=1
        continue
    fi
    seed_dir=$seeds/$name
    [ -d "$seed_dir" ] || seed_dir=$seeds/default
    corpus=$build/fuzz-corpus/$name    # grows across runs
    # Committed inputs (tests/fuzz/inputs/NAME/): seeds too large to write here, and every input
    # that once crashed, so that each run starts by replaying them.
    inputs=tests/fuzz/inputs/$name
    extra=()
    [ -d "$inputs" ] && extra=("$inputs")
    artifacts=$build/fuzz-artifacts/$name/
    mkdir -p "$corpus" "$artifacts"
    echo "fuzz: $name for ${seconds}s"
    if ! "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -dict="$seeds/json.dict" -artifact_prefix="$artifacts" "$corpus" "$seed_dir" "${extra[@]}" \
        >"$build/fuzz-$name.log" 2>&1; then
        echo "fuzz: $name FAILED; reproducer in $artifacts, log $build/fuzz-$name.log" >&2
        tail -n 40 "$build/fuzz-$name.log" >&2
        status=1
    else
        grep -E '^stat::number_of_executed_units' "$build/fuzz-$name.log" || true
    fi
done
exit $status
