// attention_flops: the FLOPs of the shared-KV attention for given queries (the kernel itself is
// attention_tc.cu; the CUDA-core kernel that stood beside it only as its cross-check was removed
// in stop 18: the tensor-core kernel is checked against the CPU reference directly, edge cases
// included, tests/cuda/test_attention_cuda.cpp and test_attention_tc_cuda.cpp).
#include <algorithm>

#include "ops/cuda/attention.h"

namespace cpfill::ops::cuda {

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
