#!/usr/bin/env bash
# cpfill serve on a GPU machine, after scripts/gpu-check.sh built build-gpu: a generated model in
# the release's formats (upstream names, fp8 linears, fp4 experts; SERVE_PRESET, default tiny),
# `serve --device cuda` on an ephemeral port, the first request's TTFT against warm ones, and
# `bench-serve` at 1 and 8 clients (SERVE_LENGTHS, default 200,1k). SERVE_PRESET=flash-slice has
# all 256 experts (~30 GB to write: many minutes); SERVE_CONFIG=scripts/configs/flash-slice-32-
# experts.json is V4-Flash's dimensions with 32 experts (4.4 GB, as scripts/load-check.sh loads).
# SERVE_LONG=N adds one request
# of N tokens, over the default 8192-token batch budget, which the server runs in chunks.
# SERVE_CP=N serves over N GPUs (`serve --cp N`), SERVE_REPLICAS=R R such replicas (R × N GPUs,
# `serve --replicas R`); SERVE_CLIENTS the bench-serve concurrencies (default 1,8). Logs and results under $OUT (or ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-gpu-out}
mkdir -p "$out"
bin=build-gpu/cpfill
model=$(mktemp -d)/model
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$(dirname "$model")"' EXIT
if [ -n "${SERVE_CONFIG:-}" ]; then
    source_args=(--config "$SERVE_CONFIG")
else
    source_args=(--preset "${SERVE_PRESET:-tiny}")
fi
"$bin" gen-model "${source_args[@]}" --names upstream --dtype fp8 --experts fp4 \
    --out "$model" >"$out/serve-gen.log" 2>&1 || { echo "serve-check: gen-model failed"; exit 1; }
"$bin" serve --model "$model" --device cuda --cp "${SERVE_CP:-1}" --replicas "${SERVE_REPLICAS:-1}" \
    --port 0 >"$out/serve.out" \
    2>"$out/serve.log" &
pid=$!
port=""
for _ in $(seq 1 600); do  # the port line comes before the load; at most 60 s
    port=$(sed -n 's|^listening on http://127.0.0.1:\([0-9]*\)$|\1|p' "$out/serve.out")
    [ -n "$port" ] && break
    sleep 0.1
done
[ -n "$port" ] || { echo "serve-check: no port line"; cat "$out/serve.log"; exit 1; }
url=http://127.0.0.1:$port
for _ in $(seq 1 300); do  # ready within 300 s
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && break
    sleep 1
done
status=0
ids=$(python3 -c 'import random; random.seed(1); print(",".join(str(random.randrange(500)) for _ in range(200)))')
for i in 1 2 3; do  # the first request after the warm-up, then warm ones
    curl -s -X POST "$url/v1/prefill" -H 'Content-Type: application/json' -d "{\"input_ids\": [[${ids}]], \"top_logprobs\": 3}" \
        >"$out/serve-prefill-$i.json" || status=1
done
if [ -n "${SERVE_LONG:-}" ]; then
    python3 -c "import random; random.seed(2); print('{\"input_ids\": [[' + ','.join(str(random.randrange(500)) for _ in range(${SERVE_LONG})) + ']]}')" >"$out/serve-long-request.json"
    code=$(curl -s -o "$out/serve-long.json" -w '%{http_code}' -X POST "$url/v1/prefill" \
        -H 'Content-Type: application/json' --data-binary @"$out/serve-long-request.json")
    [ "$code" = 200 ] || status=1
    python3 - "$out/serve-long.json" "$code" "$SERVE_LONG" <<'PY' || status=1
import json, sys
j = json.load(open(sys.argv[1]))
print(f"serve-check: a {sys.argv[3]}-token request: HTTP {sys.argv[2]}, prefill "
      f"{j['timings']['prefill_ms']:.1f} ms, first token {j['requests'][0]['first_token']}")
PY
fi
curl -s "$url/metrics" >"$out/serve-metrics.txt" || status=1
"$bin" bench-serve --url "$url" --concurrency "${SERVE_CLIENTS:-1,8}" \
    --lengths "${SERVE_LENGTHS:-200,1k}" --requests 32 --json "$out/bench-serve.json" \
    >"$out/bench-serve.md" 2>"$out/bench-serve.log" || status=1
kill -TERM "$pid"
wait "$pid" || status=1
grep -h "ready\|error" "$out/serve.log" | head -5
head -c 400 "$out/serve-prefill-1.json"; echo
python3 - "$out" <<'PY' || status=1
import json, sys
ms = [json.load(open(f"{sys.argv[1]}/serve-prefill-{i}.json"))["timings"]["prefill_ms"] for i in (1, 2, 3)]
print("serve-check: prefill of the first request after the warm-up %.1f ms, then %.1f, %.1f ms" % tuple(ms))
PY
cat "$out/bench-serve.md"
echo "serve-check: status $status"
exit $status
