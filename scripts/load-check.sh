#!/usr/bin/env bash
# Load throughput on a GPU machine, after scripts/gpu-check.sh built build-gpu: a checkpoint of
# V4-Flash's dimensions (scripts/configs/flash-slice-32-experts.json: 4 layers, 32 routed experts;
# upstream names, fp8 linears, fp4 experts;
# LOAD_VOCAB replaces the 129,280-id vocabulary, LOAD_WEIGHTS the list of --weights runs)
# generated into a temporary folder, then `run --device cuda` loading it with --weights fp8 (fp4
# experts re-encoded into fp8) and auto (fp4 kept), for each upload in LOAD_UPLOADS ("stored":
# stored bytes decoded on the GPU, the default; "host": host fp32, the older way). GB/s = stored
# bytes / load seconds, from the page cache (the checkpoint was just written); LOAD_THREADS lists
# --threads values (0: all). Results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
bin=build-gpu/cpfill
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - scripts/configs/flash-slice-32-experts.json "$dir/config.json" "${LOAD_VOCAB:-129280}" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["vocab_size"] = int(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
t0=$(date +%s.%N)
"$bin" gen-model --config "$dir/config.json" --names upstream --dtype fp8 --experts fp4 \
    --out "$dir/m" >"$out/load-gen.log" 2>&1 || { echo "load-check: gen-model failed"; tail -3 "$out/load-gen.log"; exit 1; }
bytes=$(du -sb "$dir/m" | cut -f1)
echo "load-check: generated $((bytes / 1000000)) MB in $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
status=0
for up in ${LOAD_UPLOADS:-stored}; do
for w in ${LOAD_WEIGHTS:-fp8 auto fp8 auto}; do
for th in ${LOAD_THREADS:-0}; do
    log="$out/load-$up-$w-$th"
    CPFILL_UPLOAD=$up "$bin" run --model "$dir/m" --device cuda --weights "$w" --threads "$th" \
        --input-ids 1,2,3,4,5,6,7,8 --json >"$log.json" 2>"$log.log" ||
        { status=1; tail -3 "$log.log"; continue; }
    python3 - "$log.json" "$bytes" "$w" "$up" "$th" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); b = int(sys.argv[2]); t = j["timings"]["load_s"]
print(f"load-check: {sys.argv[4]} upload, --weights {sys.argv[3]} ({j['gpu']['weights']}), "
      f"--threads {sys.argv[5]}: load {t:.2f} s, {b / t / 1e9:.2f} GB/s of {b / 1e9:.2f} GB "
      f"stored; first token {j['requests'][0]['first_token']}")
if "load" in j["gpu"]:
    print("load-check:   ", json.dumps(j["gpu"]["load"]))
PY
done
done
done
# LOAD_TTFT="N …": an N-token prompt run 3 times in one process, cold (--no-warmup) and after the
# warm-up (pseudo-random ids, up to 8192): the first prefill of a process against the warm ones.
for n in ${LOAD_TTFT:-}; do
    python3 -c "print(','.join(str(i * 7919 % 50000) for i in range($n)))" >"$dir/ids.txt"
    for wu in --no-warmup ""; do
        "$bin" run --model "$dir/m" --device cuda --input-ids-file "$dir/ids.txt" --repeat 3 $wu \
            --json >"$out/ttft-$n$wu.json" 2>"$out/ttft-$n$wu.log" || { status=1; tail -3 "$out/ttft-$n$wu.log"; continue; }
        python3 - "$out/ttft-$n$wu.json" "$wu" "$n" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); t = j["timings"]; g = j["gpu"]
print(f"load-check: {sys.argv[3]} tokens, {sys.argv[2] or 'warm-up'}: warm-up "
      f"{t['warmup_s'] * 1e3:.1f} ms, TTFT {t['ttft_s'] * 1e3:.1f} ms (GEMM plans made "
      f"{g['gemm_plans_made']} in {g['gemm_plan_s'] * 1e3:.1f} ms, arena {g['arena_grow_s'] * 1e3:.1f} ms), "
      "then " + ", ".join(f"{x * 1e3:.1f}" for x in t["repeat_ttft_s"]) + " ms")
PY
    done
done
exit $status
