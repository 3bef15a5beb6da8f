# shellcheck shell=bash
# Sourced by the scripts that build and run on the GPU machine (gpu-check.sh, ab-bench.sh,
# partial-build.sh, kernel-profile.sh, mhc-profile.sh, ncu-kernel.sh), from the repository root:
# the packages that machine lacks (scripts/fetch-gpu-deps.sh; carry [".cache/gpu-deps"]) on the
# search paths, nvcc on PATH, NVLink multicast off (the lent machines forbid it), the CMake
# settings of a GPU build (gpu_cmake_flags: Release, sm_90a) and gpu_ncu (Nsight Compute's path).
export NCCL_NVLS_ENABLE=0
if [ -d .cache/gpu-deps/usr ]; then
    deps=$PWD/.cache/gpu-deps/usr
    export CMAKE_PREFIX_PATH=$deps${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
    export PKG_CONFIG_PATH=$deps/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export CPATH=$deps/include:$deps/include/x86_64-linux-gnu${CPATH:+:$CPATH}
fi
export PATH=/usr/local/cuda/bin:$PATH
# shellcheck disable=SC2034  # used by the scripts that source this one
gpu_cmake_flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCPFILL_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a)

# The Nsight Compute binary (on PATH, or where the toolkit or the standalone installer put it), or
# nothing: scripts test for an empty answer and say there is no ncu.
gpu_ncu() {
    command -v ncu || find /usr/local/cuda/bin /opt/nvidia/nsight-compute -maxdepth 2 -name ncu \
        -type f 2>/dev/null | head -n 1 || true  # none found is an answer, not a failure (set -e)
}
