// compress_pool: one thread per (window, channel), a single pass over the window's slots with an
// online (running-max) softmax in fp32. Adjacent threads read adjacent channels of the same slot
// row, so every slot read is coalesced; the whole op reads each projection row once (HCA) or twice
// (CSA, overlapping windows).
#include <algorithm>

#include "ops/cuda/compressor.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

constexpr int kThreads = 128;

// grid: (windows, channel blocks). Slot s of window w is token w·R + s − (overlap ? R : 0), at
// channel offset 0 (Ca, s < R with overlap) or dim (Cb), bias row s mod R.
__global__ void compress_pool_kernel(int ratio, int64_t dim, bool overlap, const __nv_bfloat16* kv,
                                     const __nv_bfloat16* gate, int64_t ld, int64_t row0,
                                     const float* bias, int64_t w_begin, __nv_bfloat16* out) {
    const int64_t c = blockIdx.y * static_cast<int64_t>(kThreads) + threadIdx.x;
    if (c >= dim) return;
    const int64_t w = w_begin + blockIdx.x;
    const int64_t width = overlap ? 2 * dim : dim;
    const int n_slots = overlap ? 2 * ratio : ratio;
    const int first = (overlap && w == 0) ? ratio : 0;  // window 0 has no Ca slots
    float m = -INFINITY, sum = 0.0f, acc = 0.0f;
    for (int s = first; s < n_slots; ++s) {
        const bool ca = overlap && s < ratio;
        const int i = s % ratio;
        const int64_t token = (overlap ? (w - 1) * ratio : w * ratio) + s;
        const int64_t ch = c + ((overlap && !ca) ? dim : 0);
        const int64_t at = (token - row0) * ld + ch;
        const float logit = __bfloat162float(gate[at]) + bias[i * width + ch];
        const float v = __bfloat162float(kv[at]);
        if (logit > m) {  // rescale what was summed so far to the new max
            const float f = expf(m - logit);
            sum *= f;
            acc *= f;
            m = logit;
        }
        const float e = expf(logit - m);
        sum += e;
        acc += e * v;
    }
    out[blockIdx.x * dim + c] = __float2bfloat16(acc / sum);
}

}  // namespace

void compress_pool(const PoolSpec& spec, const __nv_bfloat16* kv, const __nv_bfloat16* gate,
                   int64_t ld, int64_t row0, const float* bias, int64_t w_begin, int64_t w_end,
                   __nv_bfloat16* out, cudaStream_t stream) {
    if (w_end <= w_begin) return;
    const int64_t width = spec.overlap ? 2 * spec.dim : spec.dim;
    CPFILL_CHECK(spec.ratio >= 1 && spec.dim >= 1, "compress_pool: ratio {} and dim {} must be ≥ 1",
                 spec.ratio, spec.dim);
    CPFILL_CHECK(ld >= width, "compress_pool: row stride {} is below the row width {}", ld, width);
    const int64_t first_token =
        std::max<int64_t>(0, (w_begin - (spec.overlap ? 1 : 0)) * spec.ratio);
    CPFILL_CHECK(first_token >= row0, "compressor needs token {} but rows start at {}", first_token,
                 row0);
    const dim3 grid(static_cast<unsigned>(w_end - w_begin),
                    static_cast<unsigned>((spec.dim + kThreads - 1) / kThreads));
    compress_pool_kernel<<<grid, kThreads, 0, stream>>>(spec.ratio, spec.dim, spec.overlap, kv,
                                                        gate, ld, row0, bias, w_begin, out);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cpfill::ops::cuda
