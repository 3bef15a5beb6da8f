#!/usr/bin/env bash
# Issue 13's runs on a machine with N ≥ 2 GPUs, in one device call after scripts/gpu-check.sh
# built build-gpu and ran the GPU tests (on such a machine those include the CP = 2 tests, the
# failing-peer test and the mpirun mode; check-gpu-skips passes only if they ran). Each part is
# bounded in time (CP_CHECK_PART_TIMEOUT s, default 420) so that a slow one cannot take the rest:
#   scaling  flash-slice, CP 1 and N, TBO off / on / auto, lengths CP_LENGTHS (default
#            32k,64k,128k,256k; a length whose one pass does not fit runs in chunks), weights
#            CP_WEIGHTS (default fp8): the CP speed-up, exposed communication, TBO never slower
#   flash    the whole V4-Flash (43 layers, random weights generated on the GPUs in the release's
#            formats: fp8 linears, packed fp4 experts) at CP N, TBO auto, CP_FLASH_LENGTHS (default
#            8k,32k,64k,128k): measured end to end, not projected
#   serve    scripts/serve-check.sh with `serve --cp N` (V4-Flash's dimensions, 32 experts) under
#            bench-serve at 1, 8 and 32 clients, prompts of 1k and 8k tokens
#   replicas scripts/serve-check.sh as `serve`, but N replicas of CP 1 (`serve --replicas N`):
#            throughput and TTFT against `serve`'s CP N at the same clients (docs/serve.md)
#   ce       the scaling sweep's CP N rows again with `--collectives ce` (the copy engines;
#            docs/parallel.md): exposed communication and TTFT against the NCCL rows of `scaling`
# CP_CHECK_PARTS picks some (default scaling,ce,flash,serve,replicas); N is every GPU (CP_N overrides).
# Results under $OUT (or ./gpu-out): cp-<part>.md / .json / .log, and cp-check.txt, the summary.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0), as the lent machines require.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-gpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
bin=build-gpu/cpfill
[ -x "$bin" ] || { echo "cp-check: $bin is not built (run scripts/gpu-check.sh first)"; exit 1; }
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
n=${CP_N:-$gpus}
if [ "${n:-0}" -lt 2 ]; then
    echo "cp-check: needs 2 or more GPUs (found ${gpus:-0}; CP_N=${CP_N:-unset})"
    exit 1
fi
limit=${CP_CHECK_PART_TIMEOUT:-420}
parts=,${CP_CHECK_PARTS:-scaling,ce,flash,serve,replicas},
summary=$out/cp-check.txt
echo "cp-check: $n GPUs, parts ${parts:1:-1}" | tee "$summary"
status=0

run_part() {  # run_part NAME COMMAND…: time-bounded, stdout to cp-NAME.md, stderr to cp-NAME.log
    local name=$1 t0 rc
    shift
    t0=$(date +%s)
    timeout "$limit" "$@" >"$out/cp-$name.md" 2>"$out/cp-$name.log"
    rc=$?
    echo "cp-check: $name rc $rc in $(($(date +%s) - t0)) s" | tee -a "$summary"
    [ $rc -eq 0 ] || { status=1; tail -n 5 "$out/cp-$name.log" | tee -a "$summary"; }
    grep -E '^\| [0-9]' "$out/cp-$name.md" >>"$summary" || true
}

if [[ $parts == *,scaling,* ]]; then
    run_part scaling "$bin" bench --preset flash-slice --lengths "${CP_LENGTHS:-32k,64k,128k,256k}" \
        --cp "1,$n" --tbo off,on,auto --weights "${CP_WEIGHTS:-fp8}" --repeat 3 \
        --json "$out/cp-scaling.json" --plot "$out/cp-scaling.svg"
fi
if [[ $parts == *,ce,* ]]; then
    run_part ce "$bin" bench --preset flash-slice --lengths "${CP_LENGTHS:-32k,64k,128k,256k}" \
        --cp "$n" --tbo off,on,auto --weights "${CP_WEIGHTS:-fp8}" --repeat 3 --collectives ce \
        --json "$out/cp-ce.json"
fi
if [[ $parts == *,flash,* ]]; then
    run_part flash "$bin" bench --preset flash --lengths "${CP_FLASH_LENGTHS:-8k,32k,64k,128k}" \
        --cp "$n" --tbo auto --weights fp4 --repeat 1 --warmup 1 --json "$out/cp-flash.json"
fi
if [[ $parts == *,serve,* ]]; then
    run_part serve env OUT="$out" SERVE_CP="$n" SERVE_CLIENTS=1,8,32 \
        SERVE_LENGTHS=1k,8k SERVE_CONFIG=scripts/configs/flash-slice-32-experts.json \
        bash scripts/serve-check.sh
fi
if [[ $parts == *,replicas,* ]]; then
    mkdir -p "$out/replicas"
    run_part replicas env OUT="$out/replicas" SERVE_CP=1 SERVE_REPLICAS="$n" SERVE_CLIENTS=1,8,32 \
        SERVE_LENGTHS=1k,8k SERVE_CONFIG=scripts/configs/flash-slice-32-experts.json \
        bash scripts/serve-check.sh
fi
echo "cp-check: status $status" | tee -a "$summary"
exit $status
