// The host side shared by the attention kernels (attention_tc.cu, attention_wg.cu): the choice
// between them, their argument checks, and attention_flops, the FLOPs of the shared-KV attention
// for given queries. (The CUDA-core kernel that stood beside it only as its cross-check was removed
// in stop 18: the tensor-core kernel is checked against the CPU reference directly, edge cases
// included, tests/cuda/test_attention_cuda.cpp and test_attention_tc_cuda.cpp).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "ops/cuda/attention.h"

namespace cpfill::ops::cuda {

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

AttnKernel parse_attention_kernel(const char* env) {
    const std::string v = env ? env : "auto";
    CPFILL_CHECK(v == "auto" || v == "tc" || v == "wg",
                 "CPFILL_ATTENTION={}: expected auto (the default), tc or wg", v);
    return v == "tc" ? AttnKernel::Tc : v == "wg" ? AttnKernel::Wg : AttnKernel::Auto;
}

// CPFILL_ATTENTION=tc|wg names the kernel instead (for comparisons, as CPFILL_UPLOAD does for
// loading); read once per process.
AttnKernel attention_kernel() {
    static const AttnKernel choice = parse_attention_kernel(std::getenv("CPFILL_ATTENTION"));
    return choice;
}

AttnKernel attention_kernel_for(int rope_dim) {
    // Auto: attention_wg, 1.7–2.0× attention_tc's rate and 19–20 ms less per prefill of the flash
    // slice at 64k (session 33, docs/performance-notes.md), where it runs. Whether this GPU is a
    // Hopper is asked once per process (the model runs on one kind of GPU).
    static const bool hopper = attention_wg_supported();
    const AttnKernel k = attention_kernel();
    if (k != AttnKernel::Auto) return k;
    return hopper && rope_dim <= kWgMaxRopeDim ? AttnKernel::Wg : AttnKernel::Tc;
}

const char* attention_kernel_name(AttnKernel k) {
    return k == AttnKernel::Wg ? "attention_wg" : k == AttnKernel::Tc ? "attention_tc" : "auto";
}

void attention(const AttnArgs& a, cudaStream_t stream) {
    if (attention_kernel_for(a.rope_dim) == AttnKernel::Wg)
        attention_wg(a, stream);
    else
        attention_tc(a, stream);
}

void check_attention_args(const AttnArgs& a, const char* kernel) {
    CPFILL_CHECK(a.head_dim == 512, "{}: head_dim {} is not supported (512 only)", kernel,
                 a.head_dim);
    CPFILL_CHECK(a.n_heads >= 1 && a.window_size >= 1 && a.window0 >= 0,
                 "{}: n_heads {}, window {}, window0 {}", kernel, a.n_heads, a.window_size,
                 a.window0);
    CPFILL_CHECK(a.entry_idx == nullptr || a.idx_stride >= 0, "{}: idx_stride {}", kernel,
                 a.idx_stride);
    CPFILL_CHECK(aligned16(a.q) && aligned16(a.window) && aligned16(a.entries) && aligned16(a.out),
                 "{}: q, window, entries and out must be 16-byte aligned", kernel);
    CPFILL_CHECK(a.rope_dim >= 0 && a.rope_dim <= 512 && a.rope_dim % 2 == 0 &&
                     (a.rope_dim == 0 || a.inv_freq != nullptr),
                 "{}: rope_dim {} (even, at most 512) needs inv_freq (found {})", kernel,
                 a.rope_dim, a.inv_freq ? "set" : "null");
}

double attention_flops(const AttnArgs& a, const int64_t* host_pos, const int32_t* host_idx) {
    double keys = 0;
    for (int64_t i = 0; i < a.n_q; ++i) {
        const int64_t p = host_pos[i];
        keys += static_cast<double>(std::min<int64_t>(p + 1, a.window_size));
        if (host_idx) {
            for (int64_t e = 0; e < a.idx_stride; ++e) keys += host_idx[i * a.idx_stride + e] >= 0;
        } else if (a.ratio > 0) {
            keys += static_cast<double>(std::min<int64_t>((p + 1) / a.ratio, a.n_entries));
        }
    }
    return keys * a.n_heads * a.head_dim * 4.0;  // q·k and p·v, 2 flops per multiply-add each
}

}  // namespace cpfill::ops::cuda
