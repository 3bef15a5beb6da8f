#!/usr/bin/env bash
# A/B timing of this tree against a base revision, both built on the same GPU machine, their
# `cpfill bench` runs alternating (base, this, base, this, …): the method of every kernel change
# since session 34, which each session had written again as a temporary wrapper.
#   scripts/ab-bench.sh prepare [REV]   here (default REV: HEAD): the tree at REV, as git archive
#                                       writes it, into .cache/ab-base (carry it to the device)
#   scripts/ab-bench.sh run [ROUNDS] [bench arguments…]   on the GPU machine: builds cpfill from
#                                       .cache/ab-base (in /tmp/ab-base) and from this tree (in
#                                       build-gpu, as scripts/gpu-check.sh does), then ROUNDS
#                                       (default 2) rounds of base and this; results under $OUT
#                                       (or ./gpu-out): ab.md (each run's result rows, the first
#                                       column naming the run, then the summary below),
#                                       ab-benches.tgz (every run's output), ab-build.log
#   scripts/ab-bench.sh summary AB.md   the summary of an ab.md: per bench row (cp, TBO, weights,
#                                       length) the TTFT of every base and every this run and the
#                                       change of their means (ms, %)
# Default bench arguments: --preset flash-slice --lengths 8k,64k --cp 1 --tbo off --weights
# bf16,fp8 --repeat 3. Carry [".cache/ab-base", ".cache/gpu-deps"] (the build needs cpp-httplib).
# The base is built with this tree's build settings; AB_TIMEOUT (s, default 150) bounds each bench.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
mode=${1:-}
shift || true

if [ "$mode" = prepare ]; then
    rev=${1:-HEAD}
    sha=$(git rev-parse --verify "$rev^{commit}") || exit 1
    rm -rf .cache/ab-base && mkdir -p .cache/ab-base
    git archive "$sha" | tar -x -C .cache/ab-base || exit 1
    echo "$sha" >.cache/ab-base/.ab-revision
    echo "ab-bench: .cache/ab-base holds $(git log -1 --format='%h %s' "$sha")"
    exit 0
fi
# The summary of an ab.md (stdout): the TTFT column found by its header, each row keyed by the
# four columns before TFLOP (cp, TBO, weights, length), in the order first seen.
summary() {
    awk -F'|' '
        function trim(x) { gsub(/^ +| +$/, "", x); return x }
        {
            if ($0 !~ /^\| (base|this) [0-9]+ \|/) next
            split(trim($2), run, " ")
            if ($0 ~ /TTFT ms/) {  # a header: where TTFT is, and that its rows follow
                col = 0
                for (i = 3; i <= NF; ++i) if (trim($i) == "TTFT ms") col = i
                in_ttft[run[1] run[2]] = col
                next
            }
            if (trim($3) == "cp") { in_ttft[run[1] run[2]] = 0; next }  # another table
            c = in_ttft[run[1] run[2]]
            if (!c) next
            key = trim($3) " | " trim($4) " | " trim($5) " | " trim($6)
            if (!(key in seen)) { seen[key] = 1; order[++n] = key }
            v = trim($c) + 0
            list[key, run[1]] = list[key, run[1]] (list[key, run[1]] == "" ? "" : " / ") trim($c)
            sum[key, run[1]] += v; cnt[key, run[1]]++
        }
        END {
            if (n == 0) { print "ab-bench: no TTFT rows in the table" > "/dev/stderr"; exit 1 }
            print "| cp | TBO | weights | length | base TTFT ms | this TTFT ms | change ms | change |"
            print "|---|---|---|---|---:|---:|---:|---:|"
            for (i = 1; i <= n; ++i) {
                k = order[i]
                if (!cnt[k, "base"] || !cnt[k, "this"]) {
                    printf "| %s | %s | %s | – | – |\n", k, list[k, "base"], list[k, "this"]
                    continue
                }
                b = sum[k, "base"] / cnt[k, "base"]; t = sum[k, "this"] / cnt[k, "this"]
                printf "| %s | %s | %s | %+.1f | %+.1f%% |\n", k, list[k, "base"], list[k, "this"],
                    t - b, 100 * (t - b) / b
            }
        }' "$1"
}
if [ "$mode" = summary ]; then
    [ -f "${1:-}" ] || {
        echo "usage: scripts/ab-bench.sh summary AB.md (no file ${1:-given})" >&2
        exit 2
    }
    summary "$1"
    exit
fi
if [ "$mode" != run ]; then
    echo "usage: scripts/ab-bench.sh prepare [REV] | run [ROUNDS] [bench arguments…] | summary AB.md" >&2
    exit 2
fi
[ -f .cache/ab-base/.ab-revision ] || {
    echo "ab-bench: no .cache/ab-base (run 'scripts/ab-bench.sh prepare REV' here and carry it)" >&2
    exit 1
}
rounds=2
if [[ ${1:-} =~ ^[0-9]+$ ]]; then
    rounds=$1
    shift
fi
args=("$@")
# shellcheck disable=SC2054  # commas inside bench arguments
[ ${#args[@]} -gt 0 ] || args=(--preset flash-slice --lengths 8k,64k --cp 1 --tbo off
    --weights bf16,fp8 --repeat 3)
out=${OUT:-gpu-out}
mkdir -p "$out"
# shellcheck source=scripts/gpu-env.sh
. scripts/gpu-env.sh  # as scripts/gpu-check.sh: the carried packages, nvcc, gpu_cmake_flags
log=$out/ab-build.log
: >"$log"
build() {  # build <source dir> <build dir>
    cmake -S "$1" -B "$2" "${gpu_cmake_flags[@]}" >>"$log" 2>&1 &&
        cmake --build "$2" -j "$(nproc)" --target cpfill >>"$log" 2>&1
}
rm -rf /tmp/ab-base && cp -r .cache/ab-base /tmp/ab-base
base_rev=$(cut -c1-10 /tmp/ab-base/.ab-revision)
if ! build /tmp/ab-base /tmp/ab-base/build || ! build . build-gpu; then
    echo "ab-bench: a build failed (the end of $log):" >&2
    tail -20 "$log" >&2
    exit 1
fi
runs=$(mktemp -d)
table=$out/ab.md
{
    echo "# ab-bench: base $base_rev against this tree, $rounds rounds"
    echo
    echo "cpfill bench ${args[*]}"
    echo
} >"$table"
status=0
for ((r = 1; r <= rounds; ++r)); do
    for side in base this; do
        bin=build-gpu/cpfill
        [ $side = base ] && bin=/tmp/ab-base/build/cpfill
        f=$runs/$side-$r.md
        if ! timeout "${AB_TIMEOUT:-150}" "$bin" bench "${args[@]}" >"$f" 2>&1; then
            status=1
            echo "$side $r failed: $(grep -m1 -E 'error|Terminated' "$f" || tail -1 "$f")" >>"$table"
        fi
        # The bench's tables, each row prefixed by the run that gave it.
        grep '^| ' "$f" | grep -v -- '---' | sed "s/^/| $side $r /" >>"$table"
    done
done
tar czf "$out/ab-benches.tgz" -C "$runs" . && rm -rf "$runs"
sum=$(summary "$table") || status=1
printf '\n## Summary\n\n%s\n' "$sum" >>"$table"
printf '%s\n' "$sum"
echo "ab-bench: $table ($rounds rounds, status $status)"
exit $status
