#!/usr/bin/env bash
# scripts/gpu-timeline.sh's reading of a trace (label unit; no GPU): a fake build folder whose
# `cpfill` writes a known trace where CUPTI's would, and the summary's figures checked against
# the ones worked out by hand below. Fails with the line it expected.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/build/bench"
: >"$tmp/build/bench/libcpfill_gpu_trace.so"
# Segment 1 (from the first embed_kernel): embed 1.0–2.0 µs; mhc 2.1–9.0 (a 0.1 µs gap: idle, but
# under the 2 µs a gap must last to be listed); gather queued at 12.0, after the GPU went idle at
# 9.0, runs 20.0–30.0: an 11 µs gap, late host; nvjet queued at 25.0 (a driver call) runs
# 40.0–50.0 on stream 9: a 10 µs gap the host was not late for. Span 49 µs, idle 21.1, busy 27.9.
# Segment 2: embed 60–61, gather 64–65 (a 3 µs gap), a copy 80–81 (15 µs).
cat >"$tmp/build/cpfill" <<'FAKE'
#!/usr/bin/env bash
[ "${FAKE_EMPTY:-0}" = 1 ] && { : >"$CPFILL_TRACE_OUT"; exit 0; }  # CUPTI recorded nothing
{
    printf 'R\t900\t950\t0\t1\t7\tcudaLaunchKernel\n'
    printf 'K\t1000\t2000\t7\t1\t0\tembed_kernel\n'
    printf 'R\t1500\t1600\t0\t2\t7\tcudaLaunchKernel\n'
    printf 'K\t2100\t9000\t7\t2\t0\tmhc_post_mix_kernel\n'
    printf 'R\t12000\t12100\t0\t3\t7\tcudaLaunchKernel\n'
    printf 'K\t20000\t30000\t7\t3\t0\tgather_kernel\n'
    printf 'D\t25000\t25100\t0\t4\t7\tcuLaunchKernelEx\n'
    printf 'K\t40000\t50000\t9\t4\t0\tnvjet_x\n'
    printf 'K\t60000\t61000\t7\t5\t0\tembed_kernel\n'
    printf 'K\t64000\t65000\t7\t6\t0\tgather_kernel\n'
    printf 'C\t80000\t81000\t7\t7\t0\tmemcpy\n'
} >"$CPFILL_TRACE_OUT"
FAKE
chmod +x "$tmp/build/cpfill"
if ! OUT=$tmp/out TIMELINE_SEGMENT=1 "$root/scripts/gpu-timeline.sh" "$tmp/build" >"$tmp/log" 2>&1; then
    echo "gpu-timeline.sh failed:"
    cat "$tmp/log"
    exit 1
fi
txt=$tmp/out/timeline-bench.txt
# shellcheck source=tests/scripts/expect_lines.sh
. "$root/tests/scripts/expect_lines.sh"
expect "$txt" '^1 +0\.049 +0\.028 +0\.021$'
expect "$txt" '^2 +0\.021 +0\.003 +0\.018$'
expect "$txt" '^ +0\.011 +1  gather_kernel$'
expect "$txt" '^ +0\.010 +1  nvjet_x$'
expect "$txt" '^ +11\.0 +8\.0  mhc_post_mix_kernel -> gather_kernel \(stream 7\)  \(late host\)$'
expect "$txt" '^ +10\.0 +15\.0  gather_kernel -> nvjet_x \(stream 9\)$'
# Time by work: every record of segment 1 with its own duration (mhc 6.9 µs, embed 1.0 µs).
expect "$txt" '^ +0\.007 +1  mhc_post_mix_kernel$'
expect "$txt" '^ +0\.001 +1  embed_kernel$'
if grep -q 'embed_kernel -> mhc' "$txt"; then
    echo "a gap under 2 us was listed"
    status=1
fi
zcat "$tmp/out/timeline-bench.tsv.gz" | grep -q 'nvjet_x' || {
    echo "the records were not kept"
    status=1
}
[ $status = 0 ] || cat "$txt"
# An empty trace (CUPTI recorded nothing) and a segment past the last are errors, said as such.
expect_error() {  # expect_error <FAKE_EMPTY> <TIMELINE_SEGMENT>
    if FAKE_EMPTY=$1 TIMELINE_SEGMENT=$2 OUT=$tmp/out2 "$root/scripts/gpu-timeline.sh" \
        "$tmp/build" >"$tmp/log2" 2>&1; then
        echo "empty $1, segment $2: gpu-timeline.sh succeeded"
        status=1
    elif ! grep -q 'gpu-timeline: the trace holds .* prefill(s)' "$tmp/log2"; then
        echo "empty $1, segment $2: no error naming the prefills:"
        cat "$tmp/log2"
        status=1
    fi
}
expect_error 1 1
expect_error 0 3
exit $status
