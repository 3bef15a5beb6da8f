// GpuWeights: upload from host fp32 weights, or generation on the device.
#include <cmath>
#include <string>

#include "core/dtype.h"
#include "model/cuda/gpu_weights.h"
#include "ops/rope.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::cuda {

namespace {

enum class Kind { Bf16, F32 };

// Uniform in [mean − √3·std, mean + √3·std] (the normal's mean and deviation), from a counter hash.
__device__ inline float hashed_uniform(uint64_t seed, uint64_t i) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [−1, 1)
}

__global__ void fill_kernel(void* out, bool bf16, int64_t n, uint64_t seed, float mean,
                            float half) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x) {
        const float v = mean + half * hashed_uniform(seed, static_cast<uint64_t>(i));
        if (bf16)
            static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
        else
            static_cast<float*>(out)[i] = v;
    }
}

// Row r: experts (h(r) + j · step) mod E, j < top_k: distinct when step is coprime to E.
__global__ void tid2eid_kernel(int64_t* out, int64_t rows, int k, int n_experts, uint64_t seed) {
    for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
         r += int64_t{gridDim.x} * blockDim.x) {
        const float u = hashed_uniform(seed, static_cast<uint64_t>(r)) * 0.5f + 0.5f;
        const int64_t base = static_cast<int64_t>(u * n_experts) % n_experts;
        for (int j = 0; j < k; ++j) out[r * k + j] = (base + int64_t{j}) % n_experts;
    }
}

uint64_t mix(uint64_t seed, uint64_t salt) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + salt * 0xD1B54A32D192ED03ull + 1;
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
    return z ^ (z >> 29);
}

// Builds one device tensor: from `host` (f32, checked against `shape`) or at random.
class Builder {
  public:
    Builder(uint64_t seed, size_t* bytes) : seed_(seed), bytes_(bytes) {}
    void operator()(DeviceBuffer& dst, Kind kind, const Shape& shape, const Tensor* host,
                    float mean, float stddev) {
        int64_t n = 1;
        for (int64_t s : shape) n *= s;
        const uint64_t salt = counter_++;
        if (host) {
            CPFILL_CHECK(host->numel() == n, "weight {}: {} values for shape {} on the GPU", salt,
                         host->numel(), n);
            dst = kind == Kind::Bf16 ? upload_bf16(host->f32(), n) : upload_f32(host->f32(), n);
        } else {
            dst = DeviceBuffer(n * (kind == Kind::Bf16 ? 2 : 4));
            if (n) {
                const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 8192));
                fill_kernel<<<blocks, 256>>>(dst.as<void>(), kind == Kind::Bf16, n,
                                             mix(seed_, salt), mean, stddev * std::sqrt(3.0f));
                CPFILL_CUDA_CHECK(cudaGetLastError());
            }
        }
        *bytes_ += dst.bytes();
    }
    // A linear [out, in]: normal(0, 1/√in) scale.
    void linear(DeviceBuffer& dst, int64_t out, int64_t in, const Tensor* host) {
        (*this)(dst, Kind::Bf16, {out, in}, host, 0.0f, 1.0f / std::sqrt(float(in)));
    }
    void norm(DeviceBuffer& dst, int64_t n, const Tensor* host) {
        (*this)(dst, Kind::F32, {n}, host, 1.0f, 0.1f);
    }

  private:
    uint64_t seed_;
    size_t* bytes_;
    uint64_t counter_ = 0;
};

const Tensor* opt(const Tensor* t) { return t && t->defined() ? t : nullptr; }

void build_mhc(Builder& b, GpuMhc& m, const ModelConfig& cfg, const MhcWeights* h) {
    const int64_t mix_n = int64_t{2 + cfg.hc} * cfg.hc, in = int64_t{cfg.hc} * cfg.d_model;
    b(m.fn, Kind::F32, {mix_n, in}, h ? &h->fn : nullptr, 0.0f, 0.5f / std::sqrt(float(in)));
    b(m.base, Kind::F32, {mix_n}, h ? &h->base : nullptr, 0.0f, 0.3f);
    b(m.scale, Kind::F32, {3}, h ? &h->scale : nullptr, 1.0f, 0.1f);
}

void build_compressor(Builder& b, GpuCompressor& c, const ModelConfig& cfg, int ratio, int64_t dim,
                      bool overlap, const CompressorWeights* h) {
    const int64_t w = (overlap ? 2 : 1) * dim;
    b.linear(c.wkv, w, cfg.d_model, h ? &h->wkv : nullptr);
    b.linear(c.wgate, w, cfg.d_model, h ? &h->wgate : nullptr);
    b(c.ape, Kind::F32, {ratio, w}, h ? &h->ape : nullptr, 0.0f, 0.5f);
    b.norm(c.norm, dim, h ? &h->norm : nullptr);
}

// Concatenates per-expert host slices into one device buffer.
void upload_experts(DeviceBuffer& dst, const std::vector<Tensor>& parts, int64_t per,
                    size_t* bytes) {
    std::vector<float> all(parts.size() * per);
    for (size_t e = 0; e < parts.size(); ++e) {
        CPFILL_CHECK(parts[e].numel() == per, "expert {}: {} values, expected {}", e,
                     parts[e].numel(), per);
        std::copy(parts[e].f32(), parts[e].f32() + per, all.begin() + e * per);
    }
    dst = upload_bf16(all.data(), all.size());
    *bytes += dst.bytes();
}

void build_layer(Builder& b, GpuLayer& g, const ModelConfig& cfg, int li, int64_t width,
                 const LayerWeights* h, size_t* bytes, uint64_t seed) {
    g.type = cfg.layer_types[li];
    g.mlp = cfg.mlp_types[li];
    const int64_t D = cfg.d_model, d = cfg.head_dim, Hd = int64_t{cfg.n_heads} * d;
    const int64_t E = cfg.n_experts;
    build_mhc(b, g.hc_attn, cfg, h ? &h->hc_attn : nullptr);
    build_mhc(b, g.hc_ffn, cfg, h ? &h->hc_ffn : nullptr);
    b.norm(g.attn_norm, D, h ? &h->attn_norm : nullptr);
    b.norm(g.ffn_norm, D, h ? &h->ffn_norm : nullptr);
    const AttentionWeights* A = h ? &h->attn : nullptr;
    b.linear(g.wq_a, cfg.q_rank, D, A ? &A->wq_a : nullptr);
    b.norm(g.q_norm, cfg.q_rank, A ? &A->q_norm : nullptr);
    b.linear(g.wq_b, Hd, cfg.q_rank, A ? &A->wq_b : nullptr);
    b.linear(g.wkv, d, D, A ? &A->wkv : nullptr);
    b.norm(g.kv_norm, d, A ? &A->kv_norm : nullptr);
    b.linear(g.wo_a, int64_t{cfg.o_groups} * cfg.o_rank, Hd / cfg.o_groups, A ? &A->wo_a : nullptr);
    b.linear(g.wo_b, D, int64_t{cfg.o_groups} * cfg.o_rank, A ? &A->wo_b : nullptr);
    b(g.sink, Kind::F32, {cfg.n_heads}, A ? &A->sink : nullptr, 0.0f, 1.0f);
    if (g.type != AttnType::Sliding) {
        const bool csa = g.type == AttnType::CSA;
        build_compressor(b, g.comp, cfg, csa ? cfg.csa_ratio : cfg.hca_ratio, d, csa,
                         A ? &A->compressor : nullptr);
        if (csa) {
            const int64_t nI = cfg.index_n_heads, dI = cfg.index_head_dim;
            build_compressor(b, g.idx_comp, cfg, cfg.csa_ratio, dI, true,
                             A ? &A->idx_compressor : nullptr);
            b.linear(g.idx_wq_b, nI * dI, cfg.q_rank, A ? &A->idx_wq_b : nullptr);
            b.linear(g.idx_weights_proj, nI, D, A ? &A->idx_weights_proj : nullptr);
        }
    }
    const MoeWeights* M = h ? &h->moe : nullptr;
    b.linear(g.gate, E, D, M ? &M->gate : nullptr);
    if (g.mlp == MlpType::Learned)
        b(g.gate_bias, Kind::F32, {E}, M ? opt(&M->gate_bias) : nullptr, 0.0f, 0.05f);
    if (g.mlp == MlpType::Hash) {
        const int64_t rows = cfg.vocab_size, k = cfg.top_k;
        g.tid2eid = DeviceBuffer(rows * k * 8);
        if (M) {
            const int64_t* ids = M->tid2eid.data<int64_t>();
            for (int64_t i = 0; i < rows * k; ++i)
                CPFILL_CHECK(ids[i] >= 0 && ids[i] < E,
                             "layer {} tid2eid[{}] names expert {}: expected 0 <= e < {}", li,
                             i / k, ids[i], E);
            CPFILL_CUDA_CHECK(
                cudaMemcpy(g.tid2eid.as<void>(), ids, rows * k * 8, cudaMemcpyHostToDevice));
        } else {
            tid2eid_kernel<<<1024, 256>>>(g.tid2eid.as<int64_t>(), rows, static_cast<int>(k),
                                          static_cast<int>(E), mix(seed, 1000 + li));
            CPFILL_CUDA_CHECK(cudaGetLastError());
        }
        *bytes += g.tid2eid.bytes();
    }
    if (M) {
        upload_experts(g.w13, M->w13, 2 * width * D, bytes);
        upload_experts(g.w2, M->w2, D * width, bytes);
    } else {
        b(g.w13, Kind::Bf16, {E, 2 * width, D}, nullptr, 0.0f, 1.0f / std::sqrt(float(D)));
        b(g.w2, Kind::Bf16, {E, D, width}, nullptr, 0.0f, 1.0f / std::sqrt(float(cfg.moe_dim)));
    }
    b(g.shared_w13, Kind::Bf16, {2 * width, D}, M ? &M->shared_w13 : nullptr, 0.0f,
      1.0f / std::sqrt(float(D)));
    b(g.shared_w2, Kind::Bf16, {D, width}, M ? &M->shared_w2 : nullptr, 0.0f,
      1.0f / std::sqrt(float(cfg.moe_dim)));
}

// The checks, the top-level tensors and the RoPE tables; `layers` sized but empty.
GpuWeights build_top(Builder& b, const ModelConfig& cfg, ExpertSlice slice,
                     const ModelWeights* host) {
    CPFILL_CHECK(cfg.rope_main.attention_factor == 1.0 && cfg.rope_compress.attention_factor == 1.0,
                 "the CUDA backend needs RoPE attention_factor 1.0 (DeepSeek-V4 forces it); found "
                 "{} / {}",
                 cfg.rope_main.attention_factor, cfg.rope_compress.attention_factor);
    CPFILL_CHECK(cfg.head_dim == 512, "the CUDA attention kernel needs head_dim 512, found {}",
                 cfg.head_dim);
    GpuWeights g;
    g.cfg = cfg;
    g.slice = slice;
    g.width = slice_width(cfg.moe_dim, slice);
    const int64_t D = cfg.d_model, V = cfg.vocab_size;
    b(g.embed, Kind::Bf16, {V, D}, host ? &host->embed : nullptr, 0.0f, 1.0f);
    b.linear(g.head, V, D, host ? &host->head : nullptr);
    b.norm(g.norm, D, host ? &host->norm : nullptr);
    b(g.hc_head_fn, Kind::F32, {cfg.hc, int64_t{cfg.hc} * D}, host ? &host->hc_head_fn : nullptr,
      0.0f, 0.5f / std::sqrt(float(cfg.hc * D)));
    b(g.hc_head_base, Kind::F32, {cfg.hc}, host ? &host->hc_head_base : nullptr, 0.0f, 0.3f);
    b(g.hc_head_scale, Kind::F32, {1}, host ? &host->hc_head_scale : nullptr, 1.0f, 0.1f);
    const ops::RopeTable main(cfg.rope_main, cfg.rope_dim), comp(cfg.rope_compress, cfg.rope_dim);
    g.inv_freq_main = upload_f32(main.inv_freq().data(), main.inv_freq().size());
    g.inv_freq_compress = upload_f32(comp.inv_freq().data(), comp.inv_freq().size());
    g.layers.resize(cfg.n_layers);
    return g;
}

}  // namespace

GpuWeights upload_top(const ModelWeights& host) {
    size_t bytes = 0;
    Builder b(0, &bytes);
    GpuWeights g = build_top(b, host.cfg, host.slice, &host);
    g.bytes = bytes;
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    return g;
}

void upload_layer(GpuWeights& g, int li, const LayerWeights& host) {
    CPFILL_CHECK(li >= 0 && li < static_cast<int>(g.layers.size()),
                 "upload_layer: layer {} of a model with {} layers", li, g.layers.size());
    CPFILL_CHECK(host.type == g.cfg.layer_types[li] && host.mlp == g.cfg.mlp_types[li],
                 "upload_layer: the host weights given for layer {} are not that layer's (empty, "
                 "or another layer's)",
                 li);
    Builder b(0, &g.bytes);
    build_layer(b, g.layers[li], g.cfg, li, g.width, &host, &g.bytes, 0);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
}

GpuWeights upload_weights(const ModelWeights& host) {
    GpuWeights g = upload_top(host);
    for (int li = 0; li < host.cfg.n_layers; ++li) upload_layer(g, li, host.layers[li]);
    return g;
}

GpuWeights random_weights(const ModelConfig& cfg, ExpertSlice slice, uint64_t seed) {
    size_t bytes = 0;
    Builder b(seed, &bytes);
    GpuWeights g = build_top(b, cfg, slice, nullptr);
    for (int li = 0; li < cfg.n_layers; ++li)
        build_layer(b, g.layers[li], cfg, li, g.width, nullptr, &bytes, seed);
    g.bytes = bytes;
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    return g;
}

}  // namespace cpfill::cuda
