#!/usr/bin/env bash
# Builds cpfill (installing what is missing) and runs the CPU test suite: labels unit and golden.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
ctest --test-dir build --output-on-failure -j "$(nproc)" -L 'unit|golden' "$@"
