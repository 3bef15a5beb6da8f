#!/usr/bin/env bash
# Where a GPU sits idle during a prefill, and why: runs a command with cpfill's CUPTI tracer
# (bench/gpu_trace.cpp, CUDA_INJECTION64_PATH) and reads its timeline. The GPU machines have
# Nsight Compute (kernels one at a time, scripts/kernel-profile.sh) but no Nsight Systems, so the
# time between kernels — waits for the host, for another stream, for a copy — had no measure
# (docs/performance-notes.md, session 47).
#   scripts/gpu-timeline.sh [build-dir] [bench arguments…]
# Default: build-gpu, --preset flash-slice --lengths 8k --cp 1 --tbo off --weights bf16; the bench
# runs with --repeat 2 --warmup 1 --no-ceilings --no-exposed. A prefill ("segment") starts at each
# embed_kernel. Writes $OUT/timeline-<tag>.tsv.gz (every record: kind K kernel, C copy, S memset,
# R runtime call, D driver call; start, end in ns; stream; correlation; thread; name) and
# $OUT/timeline-<tag>.txt (or ./gpu-out; TIMELINE_TAG names them, default bench): per segment the
# span, the time some GPU work ran and the idle rest; for segment $TIMELINE_SEGMENT (default 2,
# the first timed run) the idle time summed by the work that ended it and its 15 largest gaps, each
# with how long before the gap's end the host had queued that work (late host: queued after the
# GPU went idle; otherwise it waited for another stream, an event or a copy), and the time by work
# (each kernel's, copy's or memset's summed duration as it ran in that prefill). Recording every
# runtime and driver call slows the host a little (CUPTI: of the order of a microsecond a call),
# so the late-host gaps are an upper bound; the segments' spans are not the bench's TTFT: a segment
# runs to the next embed_kernel, so it holds the bench's own host time before the next run (a gap
# of some ms ending at that run's first kernel, iota_kernel), and the last segment is the one
# without it. Exits
# non-zero when the bench fails or the trace has fewer prefills than the segment asked for.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${1:-build-gpu}
shift || true
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--preset flash-slice --lengths 8k --cp 1 --tbo off --weights bf16)
out=${OUT:-gpu-out}
tag=${TIMELINE_TAG:-bench}
mkdir -p "$out"
lib=$build/bench/libcpfill_gpu_trace.so
if [ ! -f "$lib" ]; then
    echo "gpu-timeline: no $lib (build the target cpfill_gpu_trace)" >&2
    exit 1
fi
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
CUDA_INJECTION64_PATH=$(realpath "$lib") CPFILL_TRACE_OUT=$raw \
    "$build/cpfill" bench "${args[@]}" --repeat 2 --warmup 1 --no-ceilings --no-exposed \
    >"$out/timeline-$tag.log" 2>&1
rc=$?
gzip -c "$raw" >"$out/timeline-$tag.tsv.gz" || rc=1
{
    grep -E '^[RD]' "$raw"
    grep -E '^[KCS]' "$raw" | sort -t "$(printf '\t')" -k2,2n
} | awk -F'\t' -v want="${TIMELINE_SEGMENT:-2}" '
    # keys[1..n] reordered so that its first `limit` are the largest of val[keys[…]], largest first.
    function top(val, keys, n, limit,   i, j, t) {
        for (i = 1; i <= n && i <= limit; ++i)
            for (j = i + 1; j <= n; ++j)
                if (val[keys[j]] > val[keys[i]]) { t = keys[i]; keys[i] = keys[j]; keys[j] = t }
    }
    $1 == "R" || $1 == "D" {  # the earliest call that carries a correlation id queued its work
        if (!($5 in queued) || $2 < queued[$5]) queued[$5] = $2
        next
    }
    {
        if ($7 == "embed_kernel") { ++seg; first[seg] = $2; busy_end = $2 }
        if (seg == 0) next
        if ($2 > busy_end) {  # idle from busy_end to this record start
            gap = $2 - busy_end
            idle[seg] += gap
            if (seg == want && gap >= 2000) {
                g++; gl[g] = gap; gn[g] = $7 " (stream " $4 ")"; gp[g] = prev
                gq[g] = ($5 in queued) ? $2 - queued[$5] : -1
                by[$7] += gap; cnt[$7]++
            }
        }
        if ($3 > busy_end) busy_end = $3
        last[seg] = busy_end
        prev = $7
        if (seg == want) { kt[$7] += $3 - $2; kn[$7]++ }
    }
    END {
        if (seg < want) {  # CUPTI recorded nothing, or the command ran fewer prefills
            printf "gpu-timeline: the trace holds %d prefill(s) (embed_kernel), segment %d " \
                "asked for\n", seg, want > "/dev/stderr"
            exit 2
        }
        printf "%-8s %10s %10s %10s\n", "segment", "span ms", "busy ms", "idle ms"
        for (s = 1; s <= seg; ++s)
            printf "%-8d %10.3f %10.3f %10.3f\n", s, (last[s] - first[s]) / 1e6,
                (last[s] - first[s] - idle[s]) / 1e6, idle[s] / 1e6
        printf "\nsegment %d: idle time (gaps of 2 us or more) by the work that ended it\n", want
        printf "%10s %6s  %s\n", "ms", "gaps", "work"
        n = 0
        for (k in by) keys[++n] = k
        top(by, keys, n, 20)
        for (i = 1; i <= n && i <= 20; ++i)
            printf "%10.3f %6d  %s\n", by[keys[i]] / 1e6, cnt[keys[i]], keys[i]
        printf "\nsegment %d: the 15 largest gaps\n", want
        printf "%9s %14s  %s\n", "gap us", "queued us", "after -> before"
        for (i = 1; i <= g; ++i) idx[i] = i
        top(gl, idx, g, 15)
        for (i = 1; i <= g && i <= 15; ++i) {
            k = idx[i]
            q = gq[k] < 0 ? "?" : sprintf("%.1f", gq[k] / 1e3)
            late = gq[k] >= 0 && gq[k] < gl[k] ? "  (late host)" : ""
            printf "%9.1f %14s  %s -> %s%s\n", gl[k] / 1e3, q, gp[k], gn[k], late
        }
        # Each kernel, copy and memset as it ran in this prefill, beside the others (Nsight
        # Compute times them one at a time): its summed duration, largest first.
        printf "\nsegment %d: time by work (summed durations; work on two streams overlaps)\n", want
        printf "%10s %6s  %s\n", "ms", "runs", "work"
        m = 0
        for (k in kt) kk[++m] = k
        top(kt, kk, m, 25)
        for (i = 1; i <= m && i <= 25; ++i)
            printf "%10.3f %6d  %s\n", kt[kk[i]] / 1e6, kn[kk[i]], kk[i]
    }' >"$out/timeline-$tag.txt" || rc=1
cat "$out/timeline-$tag.txt"
exit $rc
