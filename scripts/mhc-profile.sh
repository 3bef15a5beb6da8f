#!/usr/bin/env bash
# What limits the mHC site boundary: Nsight Compute on the fused boundary's two kernels
# (ops/cuda/mhc_fused.cu: mhc_post_mix_kernel, mhc_collapse_norm_kernel) as `kernel_bench --kernel
# mhc` runs them at 8192 tokens × 4 streams × 4096, with an fp32 and a bf16 residual, each launch
# with the sections that say where its time goes: speed of light, memory workload, occupancy,
# scheduler and warp-state statistics (docs/performance-notes.md, sessions 30–31: the boundary's
# first kernel reached ≈ 58% of its bytes' floor and taking its products off the CUDA cores did
# not make it faster, so the next step is this profile, not another guess).
#   scripts/mhc-profile.sh [build-dir]     (default build-gpu)
# Writes $OUT/mhc-profile.txt (or ./gpu-out): 8 launches (each kernel twice: warm-up and timed).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${1:-build-gpu}
out=${OUT:-gpu-out}
mkdir -p "$out"
# shellcheck source=scripts/gpu-env.sh
. scripts/gpu-env.sh  # gpu_ncu
ncu=$(gpu_ncu)
if [ -z "$ncu" ]; then
    echo "mhc-profile: no ncu (Nsight Compute) on this machine" >&2
    exit 1
fi
# Shared-memory loads: instructions, the wavefronts they took (a 16-byte load whose lanes read 8
# distinct 16-byte words takes 1 to 4 wavefronts: which one says whether kernel 1's product is bound
# by shared memory, docs/performance-notes.md, session 46), bank conflicts, the pipe's share, and
# the FMAs.
shared_metrics=l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum
shared_metrics+=,smsp__sass_inst_executed_op_shared_ld.sum
shared_metrics+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
shared_metrics+=,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed
shared_metrics+=,smsp__inst_executed_pipe_fma.sum
"$ncu" --clock-control none --kernel-name 'regex:mhc_(post_mix|post_mix_ws|collapse_norm)_kernel' \
    --launch-count 8 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section Occupancy --section SchedulerStats --section WarpStateStats --section LaunchStats \
    --metrics "$shared_metrics" \
    "$build/bench/kernel_bench" --kernel mhc --repeat 1 >"$out/mhc-profile.txt" 2>&1
rc=$?
grep -E '^  [a-z_]+.*mhc_|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Eligible Warps|Issued Warp|Registers Per|shared|pipe_fma' \
    "$out/mhc-profile.txt" | head -n 80
exit $rc
