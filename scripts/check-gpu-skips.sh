#!/usr/bin/env bash
# Checks a GoogleTest log of the GPU tests from a machine with GPUS GPUs:
#   scripts/check-gpu-skips.sh LOG GPUS
# On a machine with GPUs a skipped GPU test is a failure (a broken driver must not pass), except a
# test that says it "needs N GPUs" with N > GPUS. Also fails when the log shows no passed test.
# Prints each skip it refuses, with its reason, and exits 1 if there is one.
set -euo pipefail
log=$1
gpus=$2
[ -r "$log" ] || { echo "check-gpu-skips: cannot read $log" >&2; exit 1; }
awk -v gpus="$gpus" '
    /^\[ RUN      \] / { test = $4; reason = ""; want = 0; next }
    want { reason = $0; want = 0; next }
    /: Skipped$/ { want = 1; next }
    /^\[  SKIPPED \] [^ ]+ \(/ {
        n = 0
        if (match(reason, /^needs [0-9]+ GPUs/)) n = substr(reason, 7) + 0
        if (n > gpus) { allowed++; next }
        printf "check-gpu-skips: %s skipped on a machine with %d GPU(s): %s\n", $4, gpus, reason
        bad++
        next
    }
    /^\[  PASSED  \] [0-9]+ test/ { passed = $4 + 0; seen = 1 }
    END {
        if (!seen || passed == 0) { print "check-gpu-skips: no GPU test passed"; bad++ }
        if (allowed) printf "check-gpu-skips: %d test(s) skipped for want of GPUs (%d here)\n", allowed, gpus
        exit bad ? 1 : 0
    }' "$log"
