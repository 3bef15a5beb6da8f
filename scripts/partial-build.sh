# shellcheck shell=bash
# Sourced (from the repository root) by the GPU scripts that build only the sources one test file
# needs instead of the whole tree (scripts/attention-tc-check.sh, scripts/indexer-check.sh): the
# machine's description, the compile flags, a parallel compile and the sampled clock's summary,
# written once here rather than in each script.
#   partial_build_machine FILE   GPU, memory, driver, clock and nvcc version into FILE
#   cxx_flags, cu_flags          g++ (C++20) and nvcc (sm_90a, ptxas -v) flags, CPFILL_HAVE_CUDA
#   compile OBJECT COMMAND…      runs COMMAND in the background (at most $JOBS at once, default
#                                all cores), its output in OBJECT.log; success leaves OBJECT.ok
#   compile_sources              compile of every file of the caller's cpp_srcs (g++; tests/* also
#                                with -Werror) and cu_srcs (nvcc) into $build/NAME.o, each object
#                                appended to the caller's objs
#   clock_summary FILE           one line from `nvidia-smi --query-gpu=clocks.sm,power.draw -lms`
#                                samples: mean and lowest SM clock and highest power while busy
# shellcheck source=scripts/gpu-env.sh
. scripts/gpu-env.sh  # nvcc on PATH, gpu_ncu

partial_build_machine() {
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
        nvcc --version | tail -2
    } >"$1" 2>&1
}

# shellcheck disable=SC2034  # used by the scripts that source this one
cxx_flags=(-std=c++20 -O2 -Wall -Wextra -Isrc -Itests/cuda -I/usr/local/cuda/include
           "-I/usr/include/$(gcc -dumpmachine)" -DCPFILL_HAVE_CUDA=1)
# shellcheck disable=SC2034
cu_flags=(-std=c++17 -O3 "-gencode=arch=compute_90a,code=sm_90a" -Xcompiler=-Wall -Xptxas=-v -Isrc
          -DCPFILL_HAVE_CUDA=1)

compile() {  # compile <object> <command…>
    local o=$1
    shift
    rm -f "$o.ok"
    { "$@" >"$o.log" 2>&1 && touch "$o.ok"; } &
    while (($(jobs -rp | wc -l) >= ${JOBS:-$(nproc)})); do wait -n || true; done
}

# shellcheck disable=SC2154  # build, cpp_srcs, cu_srcs and objs are the caller's
compile_sources() {
    local f o extra
    for f in "${cpp_srcs[@]}"; do
        o=$build/$(basename "$f").o
        objs+=("$o")
        extra=()
        [[ $f == tests/* ]] && extra=(-Werror)
        compile "$o" g++ "${cxx_flags[@]}" "${extra[@]}" -c "$f" -o "$o"
    done
    for f in "${cu_srcs[@]}"; do
        o=$build/$(basename "$f").o
        objs+=("$o")
        compile "$o" nvcc "${cu_flags[@]}" -c "$f" -o "$o"
    done
}

clock_summary() {  # samples above 300 W count as busy
    awk -F', ' '$2 + 0 > 300 {
            c += $1; n++
            if ($1 + 0 < lo || !lo) lo = $1 + 0
            if ($2 + 0 > p) p = $2 + 0
        }
        END { if (n) printf "busy samples: %d, SM clock mean %.0f (min %d) MHz, max power %.0f W\n",
                             n, c / n, lo, p }' "$1" || true
}
