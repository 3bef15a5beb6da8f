#!/usr/bin/env bash
# Fails when ptxas serialises a kernel's wgmma instructions without that being known and
# accepted. ptxas says so only with -Xptxas -v (its infos C7520, C7514, …: "wgmma.mma_async
# instructions are serialized due to ..."; it then waits for every MMA after issuing it), which no
# build passes: the bf16 expert kernels ran so, unseen, from session 28 to 41
# (docs/performance-notes.md, session 41). Every such info counts, whatever its number: C7520 (a
# wait the compiler put on a path it sees as divergent), C7514 (registers of a group in flight
# read by other instructions, or so ptxas could not rule out: session 43). Every CUDA source
# under src/ that issues wgmma is compiled again with the build's own command
# (BUILD_DIR/compile_commands.json) plus -Xptxas -v, into a temporary object.
#   scripts/check-wgmma.sh [build-dir]     (default build; a build without CUDA: nothing to check)
# `accepted` lists the kernels (a pattern of the mangled name) whose serialisation is measured to
# be the faster choice, each with where that is written.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
db=$build/compile_commands.json
accepted=(
    # grouped_kernel, bf16 wide tiles: serialised it ran 1.5–1.9× faster than pipelined at 1,536
    # rows per expert (grouped_fp8.cu, the wide loop's comment; performance-notes, session 41).
    'grouped_kernelILNS1_18GroupedFp8EpilogueE0ELb1ELb0EE'
)
if [ ! -f "$db" ]; then
    echo "check-wgmma: no $db (configure the build first: scripts/setup.sh $build)" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
checked=0
for src in $(git ls-files 'src/*.cu'); do
    grep -q 'wgmma' "$src" || continue
    # The entry's "command" line is the one before its "file" line (CMake writes them so).
    cmd=$(grep -B1 "\"file\": \"$PWD/$src\"" "$db" | sed -n 's/^ *"command": "\(.*\)",$/\1/p' ||
        true)  # not found: an empty answer, not the end of the script (set -e, pipefail)
    if [ -z "$cmd" ]; then
        echo "check-wgmma: $src is not compiled by $build (built without CUDA): skipped" >&2
        continue
    fi
    cmd=$(printf '%s' "$cmd" | sed -e 's/\\"/"/g' -e "s| -o [^ ]*| -Xptxas -v -o $tmp/object.o|")
    if ! (cd "$build" && eval "$cmd") >"$tmp/ptxas.log" 2>&1; then
        echo "check-wgmma: compiling $src failed:" >&2
        tail -n 20 "$tmp/ptxas.log" >&2
        exit 1
    fi
    checked=$((checked + 1))
    while IFS= read -r line; do
        kernel=$(printf '%s' "$line" | sed -n "s/.*in the function '\([^']*\)'.*/\1/p")
        ok=0
        for a in "${accepted[@]}"; do
            [[ $kernel == *"$a"* ]] && ok=1
        done
        if ((!ok)); then
            echo "check-wgmma: $src: ptxas serialises the wgmma of ${kernel:-a kernel}:" >&2
            echo "  ${line#*: }" >&2
            status=1
        fi
    done < <(grep 'wgmma.mma_async instructions are serialized' "$tmp/ptxas.log" || true)
done
echo "check-wgmma: $checked source(s) with wgmma compiled with -Xptxas -v; status $status"
exit $status
