#!/usr/bin/env bash
# scripts/ab-bench.sh's summary of an ab.md (label unit; no GPU): a table as `run` writes it, two
# rounds, with the bench's phase and projection tables between the TTFT rows (their numbers must
# not be taken for TTFTs) and a row only the base gave. Fails with the line it expected.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ab=$tmp/ab.md
{
    echo "# ab-bench: base 0123456789 against this tree, 2 rounds"
    echo
    for r in 1 2; do
        for side in base this; do
            # TTFT: base 8k 50 / 52 (mean 51), this 49 / 50 (49.5); 64k base 360 / 362, this 361 / 365.
            b8=$([ $side = base ] && echo $((48 + 2 * r)) || echo $((48 + r)))
            b64=$([ $side = base ] && echo $((358 + 2 * r)) || echo $((357 + 4 * r)))
            echo "| $side $r | cp | TBO | weights | length | TFLOP | TTFT ms | tokens/s | MFU |"
            echo "| $side $r | 1 | off | bf16 | 8k | 20.27 | $b8.0 | 157365 | 39.4% |"
            echo "| $side $r | 1 | off | bf16 | 64k in 32k chunks | 172.27 | $b64.0 | 176782 | 47.0% |"
            [ $side = base ] && echo "| $side $r | 2 | on | fp8 | 8k | 20.27 | 30.0 | 1 | 1% |"
            echo "| $side $r | cp | TBO | weights | length | attention | indexer | MoE |"
            echo "| $side $r | 1 | off | bf16 | 8k | 14.92 | 0.90 | 27.85 |"
            echo "| $side $r | cp | TBO | weights | length | model | projected TTFT ms |"
            echo "| $side $r | 1 | off | bf16 | 8k | V4-Flash | 592.9 |"
        done
    done
} >"$ab"
if ! "$root/scripts/ab-bench.sh" summary "$ab" >"$tmp/out" 2>&1; then
    echo "ab-bench.sh summary failed:"
    cat "$tmp/out"
    exit 1
fi
# shellcheck source=tests/scripts/expect_lines.sh
. "$root/tests/scripts/expect_lines.sh"
expect "$tmp/out" '^\| 1 \| off \| bf16 \| 8k \| 50\.0 / 52\.0 \| 49\.0 / 50\.0 \| -1\.5 \| -2\.9% \|$'
expect "$tmp/out" '^\| 1 \| off \| bf16 \| 64k in 32k chunks \| 360\.0 / 362\.0 \| 361\.0 / 365\.0 \| \+2\.0 \| \+0\.6% \|$'
expect "$tmp/out" '^\| 2 \| on \| fp8 \| 8k \| 30\.0 / 30\.0 \|  \| – \| – \|$'
[ "$(grep -c '^| [0-9]' "$tmp/out")" = 3 ] || {
    echo "expected 3 rows (a phase or projection row was taken for a TTFT?)"
    status=1
}
# refused FILE PATTERN WHAT: `summary FILE` fails with an error matching PATTERN.
refused() {
    if "$root/scripts/ab-bench.sh" summary "$1" >"$tmp/err" 2>&1; then
        echo "$3 was summarised without an error"
        status=1
    elif ! grep -q "$2" "$tmp/err"; then
        echo "no error naming $3:"
        cat "$tmp/err"
        status=1
    fi
}
# A table with no TTFT rows is an error, said as such; a missing file is a usage error naming it.
echo "# empty" >"$tmp/empty.md"
refused "$tmp/empty.md" 'no TTFT rows' "an ab.md without TTFT rows"
refused "$tmp/none.md" "no file $tmp/none.md" "a missing ab.md"
[ $status = 0 ] || cat "$tmp/out"
exit $status
