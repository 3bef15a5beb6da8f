// route: one warp per token; expert e lives in lane e mod 32, its key (score + bias) in shared
// memory; top_k rounds of a warp arg-max (key desc, index asc) pick the experts in the CPU's order.
// swiglu: one thread per (token, channel).
#include "ops/cuda/moe.h"
#include "ops/cuda/swiglu_device.cuh"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

constexpr int kRouteWarps = 4;  // tokens per block
constexpr int kMaxExperts = 1024;

__device__ float sqrt_softplus(float x) {
    return sqrtf(x > 20.0f ? x : log1pf(expf(x)));  // torch softplus: beta 1, threshold 20
}

__global__ void route_kernel(const float* logits, int64_t n, int n_experts, int top_k,
                             const float* bias, const int64_t* hash_ids, float routed_scale,
                             int32_t* idx, float* weight) {
    __shared__ float keys[kRouteWarps][kMaxExperts];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
    if (t >= n) return;
    const float* lt = logits + t * n_experts;
    int chosen = -1;  // lane i < top_k: the expert of round i
    if (hash_ids) {
        if (lane < top_k) chosen = static_cast<int>(hash_ids[t * top_k + lane]);
    } else {
        for (int e = lane; e < n_experts; e += 32)
            keys[warp][e] = sqrt_softplus(lt[e]) + (bias ? bias[e] : 0.0f);
        __syncwarp();
        uint32_t taken = 0;  // bit j: expert lane + 32·j already chosen
        for (int i = 0; i < top_k; ++i) {
            float best = -INFINITY;
            int best_e = 0x7fffffff;
            for (int j = 0, e = lane; e < n_experts; ++j, e += 32) {
                const float v = keys[warp][e];
                if (!(taken >> j & 1u) && (best_e == 0x7fffffff || v > best)) {
                    best = v;  // ascending e per lane: a tie keeps the lower index
                    best_e = e;
                }
            }
            for (int off = 16; off > 0; off >>= 1) {
                const float ob = __shfl_xor_sync(0xffffffffu, best, off);
                const int oe = __shfl_xor_sync(0xffffffffu, best_e, off);
                if (oe != 0x7fffffff &&
                    (best_e == 0x7fffffff || ob > best || (ob == best && oe < best_e))) {
                    best = ob;
                    best_e = oe;
                }
            }
            if (lane == (best_e & 31)) taken |= 1u << (best_e >> 5);
            if (lane == i) chosen = best_e;
        }
    }
    // Weights from the learned scores, summed in selection order as on the CPU.
    const float s = lane < top_k ? sqrt_softplus(lt[chosen]) : 0.0f;
    float sum = 0.0f;
    for (int i = 0; i < top_k; ++i) sum += __shfl_sync(0xffffffffu, s, i);
    if (lane < top_k) {
        idx[t * top_k + lane] = chosen;
        weight[t * top_k + lane] = s / (sum + 1e-20f) * routed_scale;
    }
}

// One thread per output channel.
__global__ void swiglu_kernel(const __nv_bfloat16* gate_up, int64_t n, int64_t moe_dim, float limit,
                              const float* row_scale, __nv_bfloat16* act) {
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= n * moe_dim) return;
    const int64_t t = i / moe_dim, c = i % moe_dim;
    const float g = __bfloat162float(gate_up[t * 2 * moe_dim + c]);
    const float u = __bfloat162float(gate_up[t * 2 * moe_dim + moe_dim + c]);
    act[i] = __float2bfloat16(swiglu_one(g, u, limit, row_scale ? row_scale[t] : 1.0f));
}

// One thread per 8 output channels (16-byte loads and store; moe_dim a multiple of 8).
__global__ void swiglu8_kernel(const __nv_bfloat16* gate_up, int64_t n, int64_t moe_dim,
                               float limit, const float* row_scale, __nv_bfloat16* act) {
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    const int64_t groups = moe_dim / 8;
    if (i >= n * groups) return;
    const int64_t t = i / groups, c = (i % groups) * 8;
    const uint4 g4 = *reinterpret_cast<const uint4*>(gate_up + t * 2 * moe_dim + c);
    const uint4 u4 = *reinterpret_cast<const uint4*>(gate_up + t * 2 * moe_dim + moe_dim + c);
    const float rs = row_scale ? row_scale[t] : 1.0f;
    const auto* g2 = reinterpret_cast<const __nv_bfloat162*>(&g4);
    const auto* u2 = reinterpret_cast<const __nv_bfloat162*>(&u4);
    uint4 out;
    auto* o2 = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 g = __bfloat1622float2(g2[j]), u = __bfloat1622float2(u2[j]);
        o2[j] =
            __floats2bfloat162_rn(swiglu_one(g.x, u.x, limit, rs), swiglu_one(g.y, u.y, limit, rs));
    }
    *reinterpret_cast<uint4*>(act + t * moe_dim + c) = out;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void route(const float* logits, int64_t n, int n_experts, int top_k, const float* bias,
           const int64_t* hash_ids, float routed_scale, int32_t* idx, float* weight,
           cudaStream_t stream) {
    if (n == 0) return;
    CPFILL_CHECK(n_experts >= 1 && n_experts <= kMaxExperts,
                 "route on CUDA: {} experts (1 to {} supported)", n_experts, kMaxExperts);
    CPFILL_CHECK(top_k >= 1 && top_k <= 32 && top_k <= n_experts,
                 "route on CUDA: top_k {} (1 to min(32, n_experts = {}))", top_k, n_experts);
    const unsigned blocks = static_cast<unsigned>((n + kRouteWarps - 1) / kRouteWarps);
    route_kernel<<<blocks, kRouteWarps * 32, 0, stream>>>(logits, n, n_experts, top_k, bias,
                                                          hash_ids, routed_scale, idx, weight);
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

void swiglu(const __nv_bfloat16* gate_up, int64_t n, int64_t moe_dim, float limit,
            const float* row_scale, __nv_bfloat16* act, cudaStream_t stream) {
    const int64_t total = n * moe_dim;
    if (total == 0) return;
    const int threads = 256;
    if (moe_dim % 8 == 0 && aligned16(gate_up) && aligned16(act)) {
        const unsigned blocks = static_cast<unsigned>((total / 8 + threads - 1) / threads);
        swiglu8_kernel<<<blocks, threads, 0, stream>>>(gate_up, n, moe_dim, limit, row_scale, act);
    } else {
        const unsigned blocks = static_cast<unsigned>((total + threads - 1) / threads);
        swiglu_kernel<<<blocks, threads, 0, stream>>>(gate_up, n, moe_dim, limit, row_scale, act);
    }
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cpfill::ops::cuda
