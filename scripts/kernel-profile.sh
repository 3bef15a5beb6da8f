#!/usr/bin/env bash
# Where a prefill's GPU time goes, kernel by kernel: Nsight Compute times every kernel of one
# `cpfill bench` run (serialised, one metric: gpu__time_duration) and the launches are summed by
# kernel name, largest first. For finding the non-GEMM passes behind a phase; the phase table of
# `cpfill bench` stays the measure of end-to-end time (kernels here run one at a time).
#   scripts/kernel-profile.sh [build-dir] [bench arguments…]
# Default: build-gpu, --preset flash-slice --lengths 64k --cp 1 --tbo off --weights bf16.
# Writes $OUT/profile-<tag>.txt (or ./gpu-out); PROFILE_TAG names it (default: bench).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${1:-build-gpu}
shift || true
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--preset flash-slice --lengths 64k --cp 1 --tbo off --weights bf16)
out=${OUT:-gpu-out}
mkdir -p "$out"
# shellcheck source=scripts/gpu-env.sh
. scripts/gpu-env.sh  # gpu_ncu
ncu=$(gpu_ncu)
if [ -z "$ncu" ]; then
    echo "kernel-profile: no ncu (Nsight Compute) on this machine" >&2
    exit 1
fi
raw=$(mktemp)
"$ncu" --metrics gpu__time_duration.sum --csv --print-units base --clock-control none \
    --print-kernel-base function \
    "$build/cpfill" bench "${args[@]}" --repeat 1 --warmup 0 --no-ceilings --no-exposed \
    >"$raw" 2>"$out/profile-${PROFILE_TAG:-bench}.log"
rc=$?
# CSV rows: "ID","Process ID",…,"Kernel Name",…,"Metric Name","Metric Unit","Metric Value".
python3 - "$raw" >"$out/profile-${PROFILE_TAG:-bench}.txt" <<'EOF'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
cols = rows[head]
k, v = cols.index("Kernel Name"), cols.index("Metric Value")
tot, cnt = collections.Counter(), collections.Counter()
for r in rows[head + 1:]:
    if len(r) != len(cols):
        continue
    name = r[k].strip()
    tot[name] += float(r[v].replace(",", "")) * 1e-6  # ns → ms
    cnt[name] += 1
all_ms = sum(tot.values())
print(f"{sum(cnt.values())} launches, {all_ms:.1f} ms of kernels (serialised)")
print(f"{'ms':>9} {'share':>6} {'launches':>8}  kernel")
for name, ms in tot.most_common():
    print(f"{ms:9.2f} {100 * ms / all_ms:5.1f}% {cnt[name]:8d}  {name}")
EOF
rm -f "$raw"
head -n 40 "$out/profile-${PROFILE_TAG:-bench}.txt"
exit $rc
