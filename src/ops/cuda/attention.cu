// attention: one block of 256 threads per (query, group of kGroup = 16 heads). The query's key list
// (window keys, then entries) streams through shared memory in tiles of kTile = 64 keys:
//   logits   thread (warp w, lane l): heads 2w, 2w+1 × keys l, l+32, 512-d dot products in fp32;
//   softmax  online, in registers: the warp holds all 64 logits of its two heads;
//   P·V      thread owns channels 2·tid, 2·tid+1 of all 16 heads (32 fp32 accumulators).
// Key rows are padded to 520 bf16 (1040 B) so 16-byte reads of 8 lanes of different rows hit
// different banks. Straightforward CUDA-core code, no tensor cores and no load pipelining yet.
#include <algorithm>

#include "ops/cuda/attention.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

namespace {

constexpr int kHeadDim = 512;
constexpr int kGroup = 16;  // heads per block
constexpr int kTile = 64;   // keys per shared-memory tile
constexpr int kThreads = 256;
constexpr int kLd = kHeadDim + 8;  // padded key row (bf16 elements)

struct Smem {
    float q[kGroup][kHeadDim];                // the group's queries in fp32
    float p[kTile][kGroup];                   // this tile's probabilities, key-major
    float alpha[kGroup];                      // rescale of the running sums for this tile
    float m[kGroup], l[kGroup];               // final running max and sum
    alignas(16) __nv_bfloat16 k[kTile][kLd];  // key tile (K = V)
};

__device__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

__device__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// Adds the dot products of 8 channels of key row `kr` with the same channels of two queries.
__device__ void dot8(const __nv_bfloat16* kr, const float* q0, const float* q1, float& a0,
                     float& a1) {
    const uint4 raw = *reinterpret_cast<const uint4*>(kr);
    const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
    const float4 qa = *reinterpret_cast<const float4*>(q0);
    const float4 qb = *reinterpret_cast<const float4*>(q0 + 4);
    const float4 qc = *reinterpret_cast<const float4*>(q1);
    const float4 qd = *reinterpret_cast<const float4*>(q1 + 4);
    const float2 k01 = __bfloat1622float2(k2[0]), k23 = __bfloat1622float2(k2[1]);
    const float2 k45 = __bfloat1622float2(k2[2]), k67 = __bfloat1622float2(k2[3]);
    a0 += qa.x * k01.x + qa.y * k01.y + qa.z * k23.x + qa.w * k23.y + qb.x * k45.x + qb.y * k45.y +
          qb.z * k67.x + qb.w * k67.y;
    a1 += qc.x * k01.x + qc.y * k01.y + qc.z * k23.x + qc.w * k23.y + qd.x * k45.x + qd.y * k45.y +
          qd.z * k67.x + qd.w * k67.y;
}

__global__ void __launch_bounds__(kThreads)
    attention_kernel(const __nv_bfloat16* q, const int64_t* pos, int n_heads,
                     const __nv_bfloat16* window, int window_size, const __nv_bfloat16* entries,
                     int64_t n_entries, int ratio, const int32_t* entry_idx, int64_t idx_stride,
                     const float* sinks, float scale, __nv_bfloat16* out) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem& s = *reinterpret_cast<Smem*>(smem_raw);
    const int64_t t = blockIdx.x;
    const int h0 = blockIdx.y * kGroup;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t p = pos[t];

    // Key list: n_window window keys from row j0, then n_ent entries.
    const int64_t j0 = p - window_size + 1 > 0 ? p - window_size + 1 : 0;
    const int n_window = static_cast<int>(p - j0 + 1);
    const int32_t* sel = entry_idx ? entry_idx + t * idx_stride : nullptr;
    int64_t n_ent = 0;
    if (sel) {
        for (int64_t i0 = 0; i0 < idx_stride; i0 += kThreads)
            n_ent += __syncthreads_count(i0 + tid < idx_stride && sel[i0 + tid] >= 0);
    } else if (ratio > 0) {
        n_ent = (p + 1) / ratio < n_entries ? (p + 1) / ratio : n_entries;
    }
    const int64_t n_keys = n_window + n_ent;

    for (int i = tid; i < kGroup * kHeadDim; i += kThreads) {
        const int h = i / kHeadDim, c = i % kHeadDim;
        s.q[h][c] =
            h0 + h < n_heads ? __bfloat162float(q[(t * n_heads + h0 + h) * kHeadDim + c]) : 0.0f;
    }
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // heads 2w, 2w+1
    float acc[kGroup][2] = {};                                         // channels 2·tid, +1

    for (int64_t k0 = 0; k0 < n_keys; k0 += kTile) {
        const int n_tile = static_cast<int>(n_keys - k0 < kTile ? n_keys - k0 : kTile);
        __syncthreads();  // the previous tile's P·V is done with s.k and s.p
        // 64 rows × 64 16-byte chunks; a warp copies half a row.
        for (int i = tid; i < kTile * (kHeadDim / 8); i += kThreads) {
            const int r = i / (kHeadDim / 8), c = (i % (kHeadDim / 8)) * 8;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (r < n_tile) {
                const int64_t key = k0 + r;
                const __nv_bfloat16* row;
                if (key < n_window) {
                    row = window + (j0 + key) * kHeadDim;
                } else {
                    const int64_t e = key - n_window;
                    row = entries + (sel ? static_cast<int64_t>(sel[e]) : e) * kHeadDim;
                }
                v = *reinterpret_cast<const uint4*>(row + c);
            }
            *reinterpret_cast<uint4*>(&s.k[r][c]) = v;
        }
        __syncthreads();

        // Logits for heads 2w, 2w+1 and keys lane, lane + 32.
        const int ha = 2 * warp, hb = 2 * warp + 1;
        float d[2][2] = {};
        for (int c = 0; c < kHeadDim; c += 8) {
            dot8(&s.k[lane][c], &s.q[ha][c], &s.q[hb][c], d[0][0], d[1][0]);
            dot8(&s.k[lane + 32][c], &s.q[ha][c], &s.q[hb][c], d[0][1], d[1][1]);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {  // head ha + i
            const float x0 = lane < n_tile ? d[i][0] * scale : -INFINITY;
            const float x1 = lane + 32 < n_tile ? d[i][1] * scale : -INFINITY;
            const float m_new = fmaxf(m_run[i], warp_max(fmaxf(x0, x1)));  // finite: key 0 valid
            const float alpha = expf(m_run[i] - m_new);
            const float p0 = expf(x0 - m_new), p1 = expf(x1 - m_new);
            l_run[i] = l_run[i] * alpha + warp_sum(p0 + p1);
            m_run[i] = m_new;
            s.p[lane][ha + i] = p0;
            s.p[lane + 32][ha + i] = p1;
            if (lane == 0) s.alpha[ha + i] = alpha;
        }
        __syncthreads();

        // P·V for channels 2·tid, 2·tid + 1.
#pragma unroll
        for (int h = 0; h < kGroup; ++h) {
            acc[h][0] *= s.alpha[h];
            acc[h][1] *= s.alpha[h];
        }
        for (int k = 0; k < n_tile; ++k) {
            const float2 v =
                __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&s.k[k][2 * tid]));
#pragma unroll
            for (int h4 = 0; h4 < kGroup; h4 += 4) {
                const float4 pr = *reinterpret_cast<const float4*>(&s.p[k][h4]);
                acc[h4][0] += pr.x * v.x;
                acc[h4][1] += pr.x * v.y;
                acc[h4 + 1][0] += pr.y * v.x;
                acc[h4 + 1][1] += pr.y * v.y;
                acc[h4 + 2][0] += pr.z * v.x;
                acc[h4 + 2][1] += pr.z * v.y;
                acc[h4 + 3][0] += pr.w * v.x;
                acc[h4 + 3][1] += pr.w * v.y;
            }
        }
    }

    if (lane == 0) {
        s.m[2 * warp] = m_run[0];
        s.m[2 * warp + 1] = m_run[1];
        s.l[2 * warp] = l_run[0];
        s.l[2 * warp + 1] = l_run[1];
    }
    __syncthreads();
    // Sink in the denominator only: out = acc·e^(m−M) / (l·e^(m−M) + e^(sink−M)), M = max(m, sink).
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
        if (h0 + h >= n_heads) break;
        const float sink = sinks[h0 + h];
        const float mm = fmaxf(s.m[h], sink);
        const float f = expf(s.m[h] - mm);
        const float inv = f / (s.l[h] * f + expf(sink - mm));
        __nv_bfloat162 o;
        o.x = __float2bfloat16(acc[h][0] * inv);
        o.y = __float2bfloat16(acc[h][1] * inv);
        *reinterpret_cast<__nv_bfloat162*>(&out[(t * n_heads + h0 + h) * kHeadDim + 2 * tid]) = o;
    }
}

}  // namespace

void attention(const AttnArgs& a, cudaStream_t stream) {
    if (a.n_q == 0) return;
    CPFILL_CHECK(a.head_dim == kHeadDim,
                 "attention on CUDA: head_dim {} is not supported ({} only)", a.head_dim, kHeadDim);
    CPFILL_CHECK(a.n_heads >= 1 && a.window_size >= 1, "attention: n_heads {}, window {}",
                 a.n_heads, a.window_size);
    CPFILL_CHECK(a.entry_idx == nullptr || a.idx_stride >= 0, "attention: idx_stride {}",
                 a.idx_stride);
    CPFILL_CHECK(a.n_q <= 0x7fffffff, "attention: {} queries in one call", a.n_q);
    const int smem = static_cast<int>(sizeof(Smem));
    CPFILL_CUDA_CHECK(
        cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const dim3 grid(static_cast<unsigned>(a.n_q),
                    static_cast<unsigned>((a.n_heads + kGroup - 1) / kGroup));
    attention_kernel<<<grid, kThreads, smem, stream>>>(
        a.q, a.pos, a.n_heads, a.window, a.window_size, a.entries, a.n_entries, a.ratio,
        a.entry_idx, a.idx_stride, a.sinks, a.scale, a.out);
    CPFILL_CUDA_CHECK(cudaGetLastError());
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
