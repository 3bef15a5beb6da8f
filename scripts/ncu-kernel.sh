#!/usr/bin/env bash
# One launch of one kernel under Nsight Compute's full set of sections, and where its warps wait,
# instruction by instruction: the step before changing a kernel whose bound is not known (e.g. the
# fp8 expert kernel's consumers, docs/performance-notes.md session 40).
#   scripts/ncu-kernel.sh NAME_REGEX COMMAND…
# NAME_REGEX matches the kernel's mangled name (nm on an object lists them; a template's arguments
# are in it, e.g. 'grouped_kernel.*EpilogueE1ELb0ELb0EEEv' for the fp8 expert kernel with the
# TMA-store epilogue: `scripts/ncu-kernel.sh 'grouped_kernel.*EpilogueE1ELb0ELb0EEEv'
# build-gpu/bench/fp8_gemm_bench --grouped-only --rows 1536 --reps 1`). NCU_SKIP launches of it
# are skipped first (default 0); NCU_TAG names the outputs (default kernel). Writes to $OUT (or
# ./gpu-out): ncu-TAG-details.txt (every section), ncu-TAG-stalls.txt (the 40 SASS instructions
# with the most warp-stall samples), ncu-TAG-source.csv.gz (every instruction's counters).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
if [ $# -lt 2 ]; then
    echo "usage: scripts/ncu-kernel.sh NAME_REGEX COMMAND…" >&2
    exit 2
fi
regex=$1
shift
# shellcheck source=scripts/gpu-env.sh
. scripts/gpu-env.sh
ncu=$(gpu_ncu)
if [ -z "$ncu" ]; then
    echo "ncu-kernel: no ncu (Nsight Compute) on this machine" >&2
    exit 1
fi
out=${OUT:-gpu-out}
tag=${NCU_TAG:-kernel}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT  # the report and its CSV, on every way out
rep=$tmp/profile
"$ncu" --set full --import-source no --kernel-name-base mangled --kernel-name "regex:$regex" \
    --launch-skip "${NCU_SKIP:-0}" --launch-count 1 -o "$rep" "$@" >"$out/ncu-$tag.log" 2>&1
rc=$?
if [ ! -f "$rep.ncu-rep" ]; then
    echo "ncu-kernel: no report (exit $rc; the end of $out/ncu-$tag.log):" >&2
    tail -n 15 "$out/ncu-$tag.log" >&2
    exit 1
fi
"$ncu" --import "$rep.ncu-rep" --page details >"$out/ncu-$tag-details.txt" 2>&1
"$ncu" --import "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.csv" 2>/dev/null
gzip -c "$rep.csv" >"$out/ncu-$tag-source.csv.gz"
# The instructions with the most stall samples: the columns are found by name, and if the report
# has none of that name the header is printed instead, so that a new ncu's layout shows.
python3 - "$rep.csv" >"$out/ncu-$tag-stalls.txt" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
head = next((i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r)), None)
if head is None:
    print("no 'Source' column; the first rows were:", *rows[:3], sep="\n")
    sys.exit(0)
cols = [c.strip() for c in rows[head]]
total = next((i for i, c in enumerate(cols) if c.startswith("Warp Stall Sampling (All")), None)
if total is None:
    print("no 'Warp Stall Sampling (All Samples)' column; the columns are:", *cols, sep="\n")
    sys.exit(0)
src = cols.index("Source")
def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0
body = [r for r in rows[head + 1:] if len(r) == len(cols)]
all_samples = sum(num(r[total]) for r in body) or 1.0
reasons = [i for i, c in enumerate(cols)
           if "stall" in c.lower() and not c.startswith("Warp Stall Sampling")]
print(f"{len(body)} instructions, {all_samples:.0f} stall samples; the 40 with the most:")
for r in sorted(body, key=lambda r: -num(r[total]))[:40]:
    top = sorted(((num(r[i]), cols[i]) for i in reasons), reverse=True)[:3]
    why = ", ".join(f"{name} {v:.0f}" for v, name in top if v > 0)
    print(f"{100 * num(r[total]) / all_samples:5.1f}%  {r[src].strip()[:70]:70}  {why}")
PY
head -n 45 "$out/ncu-$tag-stalls.txt"
exit 0
