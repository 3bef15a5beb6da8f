#!/usr/bin/env bash
# Fails when a C++/CUDA source is not formatted per .clang-format (Debian clang-format 14).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || scripts/setup.sh build
git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' | xargs -r clang-format --dry-run --Werror
