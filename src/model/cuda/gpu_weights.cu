// GpuWeights: upload from host fp32 weights, or generation on the device, both walking the weight
// table (io/weight_specs.h).
#include <cmath>
#include <string>

#include "core/dtype.h"
#include "model/cuda/gpu_weights.h"
#include "model/weight_bytes.h"
#include "ops/cuda/fp4.h"
#include "ops/cuda/fp8.h"
#include "ops/rope.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::cuda {

namespace {

// Uniform in [mean − √3·std, mean + √3·std] (the normal's mean and deviation), from a counter hash.
__device__ inline float hashed_uniform(uint64_t seed, uint64_t i) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [−1, 1)
}

// out[i] = value offset + i of the stream `seed`.
__global__ void fill_kernel(void* out, bool bf16, int64_t n, uint64_t seed, float mean, float half,
                            int64_t offset) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x) {
        const float v = mean + half * hashed_uniform(seed, static_cast<uint64_t>(offset + i));
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

uint64_t name_hash(std::string_view name) {  // FNV-1a: a tensor's random stream, by name
    uint64_t h = 0xCBF29CE484222325ull;
    for (char ch : name) h = (h ^ static_cast<uint8_t>(ch)) * 0x100000001B3ull;
    return h;
}

// The device buffer that weight `spec` fills: the one map from the table's slots to GpuLayer's
// fields (the routed experts' w13 / w2 are one buffer per layer, built apart).
DeviceBuffer& gpu_slot(GpuLayer& g, const WeightSpec& spec) {
    using S = WeightSlot;
    switch (spec.slot) {
        case S::HcAttnFn:
            return g.hc_attn.fn;
        case S::HcAttnBase:
            return g.hc_attn.base;
        case S::HcAttnScale:
            return g.hc_attn.scale;
        case S::HcFfnFn:
            return g.hc_ffn.fn;
        case S::HcFfnBase:
            return g.hc_ffn.base;
        case S::HcFfnScale:
            return g.hc_ffn.scale;
        case S::AttnNorm:
            return g.attn_norm;
        case S::FfnNorm:
            return g.ffn_norm;
        case S::Sink:
            return g.sink;
        case S::QNorm:
            return g.q_norm;
        case S::KvNorm:
            return g.kv_norm;
        case S::CompWkv:
            return g.comp.wkv;
        case S::CompWgate:
            return g.comp.wgate;
        case S::CompApe:
            return g.comp.ape;
        case S::CompNorm:
            return g.comp.norm;
        case S::IdxWeightsProj:
            return g.idx_weights_proj;
        case S::IdxCompWkv:
            return g.idx_comp.wkv;
        case S::IdxCompWgate:
            return g.idx_comp.wgate;
        case S::IdxCompApe:
            return g.idx_comp.ape;
        case S::IdxCompNorm:
            return g.idx_comp.norm;
        case S::Gate:
            return g.gate;
        case S::GateBias:
            return g.gate_bias;
        case S::Tid2eid:
            return g.tid2eid;
        default:
            break;
    }
    CPFILL_FAIL("weight {}: no GPU layer field for its slot", spec.name);
}

// The matrix weight `spec` fills, or null when its slot is not one of GpuLayer's matrices (the
// routed experts' w13 / w2 hold all experts and are built apart; w3 shares w1's).
GpuMatrix* gpu_matrix(GpuLayer& g, const WeightSpec& spec) {
    using S = WeightSlot;
    switch (spec.slot) {
        case S::WqA:
            return &g.wq_a;
        case S::WqB:
            return &g.wq_b;
        case S::Wkv:
            return &g.wkv;
        case S::WoA:
            return &g.wo_a;
        case S::WoB:
            return &g.wo_b;
        case S::IdxWqB:
            return &g.idx_wq_b;
        case S::W1:
            return spec.expert < 0 ? &g.shared_w13 : nullptr;
        case S::W2:
            return spec.expert < 0 ? &g.shared_w2 : nullptr;
        default:
            return nullptr;
    }
}

DeviceBuffer& gpu_top_slot(GpuWeights& g, const WeightSpec& spec) {
    switch (spec.slot) {
        case WeightSlot::Embed:
            return g.embed;
        case WeightSlot::Norm:
            return g.norm;
        case WeightSlot::Head:
            return g.head;
        case WeightSlot::HcHeadFn:
            return g.hc_head_fn;
        case WeightSlot::HcHeadBase:
            return g.hc_head_base;
        case WeightSlot::HcHeadScale:
            return g.hc_head_scale;
        default:
            break;
    }
    CPFILL_FAIL("weight {}: no top-level GPU field for its slot", spec.name);
}

// Builds device tensors at the table's GPU storage (model/weight_bytes.h): from host f32 (checked
// against the rank's element count) or at random from the table's distribution, generated on the
// device from (seed, tensor name), so the same seed gives the same weights on every rank (and the
// same values before rounding in bf16 and in fp8). fp8 matrices are quantised on the device, one
// matrix at a time through an f32 staging buffer, their inexact values counted.
class Builder {
  public:
    Builder(uint64_t seed, GpuWeights* g) : seed_(seed), g_(g) {}
    ~Builder() {
        if (counter_) cudaFree(counter_);
    }
    Builder(const Builder&) = delete;
    Builder& operator=(const Builder&) = delete;
    // `n` elements of `dtype` (bf16 or f32) named `name`, from `host` or drawn from `init`.
    void fill(DeviceBuffer& dst, DType dtype, int64_t n, const std::string& name,
              const Tensor* host, WeightInit init) {
        const bool bf16 = dtype == DType::BF16;
        if (host) {
            CPFILL_CHECK(host->numel() == n, "weight {}: {} values for {} on the GPU", name,
                         host->numel(), n);
            dst = bf16 ? upload_bf16(host->f32(), n) : upload_f32(host->f32(), n);
        } else {
            dst = DeviceBuffer(n * (bf16 ? 2 : 4));
            random(dst.as<void>(), bf16, n, name, init, 0);
        }
        g_->bytes += dst.bytes();
    }
    // Weight `spec` of a rank with expert slice `slice` (not a matrix of GpuLayer).
    void operator()(DeviceBuffer& dst, const WeightSpec& spec, const ModelConfig& cfg,
                    ExpertSlice slice, const Tensor* host) {
        fill(dst, gpu_dtype(spec), rank_numel(spec, cfg, slice), spec.name, host, spec.init);
    }
    // `count` matrices [rows, cols] stored as `st`, named `name` (its random stream runs on over
    // the matrices); matrix e from host_of(e) (f32 [rows · cols]) when from_host, else at random.
    // Fp8Row matrices are first tried as Fp8Tile (fewer scales, GEMMs 1.3× faster: docs/fp8.md),
    // and kept so when every value came out exact.
    template <class HostOf>
    void matrix(GpuMatrix& m, GpuStorage st, int64_t count, int64_t rows, int64_t cols,
                const std::string& name, WeightInit init, bool from_host, HostOf host_of) {
        if (st == GpuStorage::Fp8Row && !from_host) {
            // Random weights are defined by their rounding (the values the release would ship):
            // tiles, nothing counted.
            store(m, GpuStorage::Fp8Tile, count, rows, cols, name, init, false, host_of);
            return;
        }
        if (st == GpuStorage::Fp8Row) {
            const unsigned long long before = inexact();
            const size_t bytes = g_->bytes;
            const uint64_t values = g_->fp8_values;
            store(m, GpuStorage::Fp8Tile, count, rows, cols, name, init, from_host, host_of);
            if (inexact() == before) return;
            set_inexact(before);  // not exact in tiles: (row, 128) blocks instead
            g_->bytes = bytes;
            g_->fp8_values = values;
        }
        store(m, st, count, rows, cols, name, init, from_host, host_of);
    }
    template <class HostOf>
    void store(GpuMatrix& m, GpuStorage st, int64_t count, int64_t rows, int64_t cols,
               const std::string& name, WeightInit init, bool from_host, HostOf host_of) {
        m.storage = st;
        m.rows = rows;
        m.cols = cols;
        const int64_t per = rows * cols;
        const auto host_matrix = [&](int64_t e) {
            const Tensor* t = host_of(e);
            CPFILL_CHECK(t && t->numel() == per, "weight {}: {} values on the host, expected {}",
                         name, t ? t->numel() : 0, per);
            return t->f32();
        };
        if (st == GpuStorage::Bf16) {
            if (from_host) {
                std::vector<float> all(count * per);
                for (int64_t e = 0; e < count; ++e)
                    std::copy(host_matrix(e), host_matrix(e) + per, all.begin() + e * per);
                m.data = upload_bf16(all.data(), all.size());
            } else {
                m.data = DeviceBuffer(count * per * 2);
                random(m.data.as<void>(), true, count * per, name, init, 0);
            }
            g_->bytes += m.data.bytes();
            return;
        }
        if (st == GpuStorage::Fp4) {
            store_fp4(m, count, rows, cols, name, init, from_host, host_of);
            return;
        }
        CPFILL_CHECK(is_fp8(st), "weight {}: a matrix is bf16, fp8 or fp4", name);
        const int64_t spm = m.scales_per_matrix();
        m.data = DeviceBuffer(count * per);
        m.scale = DeviceBuffer(count * spm * 4);
        DeviceBuffer staging(per * 4);
        if (!counter_) {
            CPFILL_CUDA_CHECK(cudaMalloc(&counter_, sizeof(unsigned long long)));
            CPFILL_CUDA_CHECK(cudaMemset(counter_, 0, sizeof(unsigned long long)));
        }
        for (int64_t e = 0; e < count; ++e) {
            if (from_host)
                CPFILL_CUDA_CHECK(cudaMemcpy(staging.as<void>(), host_matrix(e), per * 4,
                                             cudaMemcpyHostToDevice));
            else
                random(staging.as<void>(), false, per, name, init, e * per);
            ops::cuda::quantize_weight_fp8(
                staging.as<float>(), rows, cols, m.blocks(), m.data.as<uint8_t>() + e * per,
                m.scale.as<float>() + e * spm, from_host ? counter_ : nullptr, nullptr);
        }
        CPFILL_CUDA_CHECK(cudaDeviceSynchronize());  // before the staging buffer is freed
        if (from_host) g_->fp8_values += static_cast<uint64_t>(count * per);
        g_->bytes += m.data.bytes() + m.scale.bytes();
    }
    // Packed fp4 (routed experts): quantised from f32 on the device; from host weights, also the
    // re-encoding to fp8 tiles the GEMMs will read is tried once and its inexact values counted.
    template <class HostOf>
    void store_fp4(GpuMatrix& m, int64_t count, int64_t rows, int64_t cols, const std::string& name,
                   WeightInit init, bool from_host, HostOf host_of) {
        const int64_t per = rows * cols, spm = m.scales_per_matrix();
        m.data = DeviceBuffer(count * per / 2);
        m.scale = DeviceBuffer(count * spm);
        DeviceBuffer staging(per * 4), q8(per),
            s8(ops::fp8_scale_count(rows, cols, ops::Fp8Blocks::Tile128) * 4);
        DeviceBuffer tk(ops::cuda::fp4_tile_scratch(1, rows, cols) * 4);
        ensure_counter();
        for (int64_t e = 0; e < count; ++e) {
            uint8_t* q = m.data.as<uint8_t>() + e * per / 2;
            uint8_t* s = m.scale.as<uint8_t>() + e * spm;
            if (from_host) {
                const Tensor* t = host_of(e);
                CPFILL_CHECK(t && t->numel() == per,
                             "weight {}: {} values on the host, expected {}", name,
                             t ? t->numel() : 0, per);
                CPFILL_CUDA_CHECK(
                    cudaMemcpy(staging.as<void>(), t->f32(), per * 4, cudaMemcpyHostToDevice));
            } else {
                random(staging.as<void>(), false, per, name, init, e * per);
            }
            ops::cuda::quantize_weight_fp4(staging.as<float>(), rows, cols, q, s,
                                           from_host ? counter_ : nullptr, nullptr);
            if (from_host)
                ops::cuda::fp4_to_fp8_tiles(q, s, 1, rows, cols, q8.as<uint8_t>(), s8.as<float>(),
                                            tk.as<int>(), counter_, nullptr);
        }
        CPFILL_CUDA_CHECK(cudaDeviceSynchronize());  // before the staging buffers are freed
        if (from_host) g_->fp8_values += static_cast<uint64_t>(count * per);
        g_->bytes += m.data.bytes() + m.scale.bytes();
    }
    void ensure_counter() {
        if (counter_) return;
        CPFILL_CUDA_CHECK(cudaMalloc(&counter_, sizeof(unsigned long long)));
        CPFILL_CUDA_CHECK(cudaMemset(counter_, 0, sizeof(unsigned long long)));
    }
    // Adds the inexact values of the matrices quantised so far to the weights' count.
    void finish() {
        g_->fp8_inexact += inexact();
        set_inexact(0);
    }
    uint64_t seed() const { return seed_; }
    size_t* bytes() const { return &g_->bytes; }

  private:
    unsigned long long inexact() const {
        unsigned long long n = 0;
        if (counter_)
            CPFILL_CUDA_CHECK(cudaMemcpy(&n, counter_, sizeof(n), cudaMemcpyDeviceToHost));
        return n;
    }
    void set_inexact(unsigned long long n) {
        if (counter_)
            CPFILL_CUDA_CHECK(cudaMemcpy(counter_, &n, sizeof(n), cudaMemcpyHostToDevice));
    }
    void random(void* dst, bool bf16, int64_t n, const std::string& name, WeightInit init,
                int64_t offset) {
        if (n == 0) return;
        const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 8192));
        fill_kernel<<<blocks, 256>>>(dst, bf16, n, mix(seed_, name_hash(name)),
                                     static_cast<float>(init.mean),
                                     static_cast<float>(init.std * std::sqrt(3.0)), offset);
        CPFILL_CUDA_CHECK(cudaGetLastError());
    }
    uint64_t seed_;
    GpuWeights* g_;
    unsigned long long* counter_ = nullptr;
};

const Tensor* opt(const Tensor* t) { return t && t->defined() ? t : nullptr; }

// tid2eid [vocab, top_k]: checked and copied from the host, or distinct experts per row at random.
void build_tid2eid(DeviceBuffer& dst, const ModelConfig& cfg, int li, const Tensor* host,
                   uint64_t seed, size_t* bytes) {
    const int64_t rows = cfg.vocab_size, k = cfg.top_k, E = cfg.n_experts;
    dst = DeviceBuffer(rows * k * 8);
    if (host) {
        const int64_t* ids = host->data<int64_t>();
        for (int64_t i = 0; i < rows * k; ++i)
            CPFILL_CHECK(ids[i] >= 0 && ids[i] < E,
                         "layer {} tid2eid[{}] names expert {}: expected 0 <= e < {}", li, i / k,
                         ids[i], E);
        CPFILL_CUDA_CHECK(cudaMemcpy(dst.as<void>(), ids, rows * k * 8, cudaMemcpyHostToDevice));
    } else {
        tid2eid_kernel<<<1024, 256>>>(dst.as<int64_t>(), rows, static_cast<int>(k),
                                      static_cast<int>(E), mix(seed, 1000 + li));
        CPFILL_CUDA_CHECK(cudaGetLastError());
    }
    *bytes += dst.bytes();
}

// Layer `li` from the weight table: every weight of the layer into its slot, from the host
// weights `h` (a rank's, as load_rank_weights makes them) or at random when h is null. The routed
// experts' slices go into one matrix buffer per layer: w13 [E][2 · width, d_model], w2 [E][d_model,
// width]; the shared expert's w1 and w3 into one [2 · width, d_model].
void build_layer(Builder& b, GpuWeights& gw, int li, LayerWeights* h) {
    const ModelConfig& cfg = gw.cfg;
    GpuLayer& g = gw.layers[li];
    g.type = cfg.layer_types[li];
    g.mlp = cfg.mlp_types[li];
    const int64_t D = cfg.d_model, E = cfg.n_experts, width = gw.width;
    for (const WeightSpec& spec : layer_weight_specs(cfg, li)) {
        const Tensor* host = h ? opt(tensor_slot(*h, spec)) : nullptr;
        if (spec.slot == WeightSlot::Tid2eid) {
            build_tid2eid(g.tid2eid, cfg, li, host, b.seed(), b.bytes());
            continue;
        }
        if (spec.slot == WeightSlot::W3 || spec.expert > 0) continue;  // with w1 / expert 0
        const GpuStorage st = gpu_storage(spec, cfg, gw.slice, gw.format);
        const bool w13 = spec.slot == WeightSlot::W1;
        if (spec.expert == 0) {  // all routed experts at once
            const std::vector<Tensor>* parts = h ? (w13 ? &h->moe.w13 : &h->moe.w2) : nullptr;
            CPFILL_CHECK(!parts || static_cast<int64_t>(parts->size()) == E,
                         "upload: layer {} has {} routed experts on the host, expected {}", li,
                         parts ? parts->size() : 0, E);
            b.matrix(w13 ? g.w13 : g.w2, st, E, w13 ? 2 * width : D, w13 ? D : width, spec.name,
                     spec.init, h != nullptr, [&](int64_t e) { return &(*parts)[e]; });
            continue;
        }
        CPFILL_CHECK(!h || host, "upload: weight {} is missing from the host weights", spec.name);
        if (GpuMatrix* m = gpu_matrix(g, spec)) {
            const bool shared = spec.shard != CpShard::Replicated;  // the shared expert
            const int64_t rows = shared ? (w13 ? 2 * width : D) : spec.shape[0];
            const int64_t cols = shared ? (w13 ? D : width) : spec.shape[1];
            b.matrix(*m, st, 1, rows, cols, spec.name, spec.init, host != nullptr,
                     [&](int64_t) { return host; });
            continue;
        }
        b(gpu_slot(g, spec), spec, cfg, gw.slice, host);
    }
    b.finish();
}

// The checks, the top-level tensors and the RoPE tables; `layers` sized but empty.
GpuWeights build_top(const ModelConfig& cfg, ExpertSlice slice, GpuWeightFormat format,
                     uint64_t seed, ModelWeights* host) {
    CPFILL_CHECK(cfg.rope_main.attention_factor == 1.0 && cfg.rope_compress.attention_factor == 1.0,
                 "the CUDA backend needs RoPE attention_factor 1.0 (DeepSeek-V4 forces it); found "
                 "{} / {}",
                 cfg.rope_main.attention_factor, cfg.rope_compress.attention_factor);
    CPFILL_CHECK(cfg.head_dim == 512, "the CUDA attention kernel needs head_dim 512, found {}",
                 cfg.head_dim);
    GpuWeights g;
    g.cfg = cfg;
    g.slice = slice;
    g.format = format;
    g.width = slice_width(cfg.moe_dim, slice);
    Builder b(seed, &g);
    for (const WeightSpec& spec : weight_specs(cfg)) {
        if (spec.layer >= 0) continue;
        const Tensor* t = host ? opt(tensor_slot(*host, spec)) : nullptr;
        CPFILL_CHECK(!host || t, "upload: weight {} is missing from the host weights", spec.name);
        b(gpu_top_slot(g, spec), spec, cfg, slice, t);
    }
    const ops::RopeTable main(cfg.rope_main, cfg.rope_dim), comp(cfg.rope_compress, cfg.rope_dim);
    g.inv_freq_main = upload_f32(main.inv_freq().data(), main.inv_freq().size());
    g.inv_freq_compress = upload_f32(comp.inv_freq().data(), comp.inv_freq().size());
    g.bytes += g.inv_freq_main.bytes() + g.inv_freq_compress.bytes();
    g.layers.resize(cfg.n_layers);
    return g;
}

}  // namespace

bool GpuWeights::dense_fp8() const {
    for (const GpuLayer& l : layers)
        for (const GpuMatrix* m :
             {&l.wq_a, &l.wq_b, &l.wkv, &l.wo_a, &l.wo_b, &l.idx_wq_b, &l.shared_w13, &l.shared_w2})
            if (m->fp8()) return true;
    return false;
}

bool GpuWeights::experts_fp8() const {
    for (const GpuLayer& l : layers)
        if (l.w13.fp8() || l.w13.fp4()) return true;
    return false;
}

bool GpuWeights::experts_fp4() const {
    for (const GpuLayer& l : layers)
        if (l.w13.fp4()) return true;
    return false;
}

GpuWeights upload_top(const ModelWeights& host, GpuWeightFormat format) {
    GpuWeights g = build_top(host.cfg, host.slice, format, 0, const_cast<ModelWeights*>(&host));
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
    Builder b(0, &g);
    build_layer(b, g, li, const_cast<LayerWeights*>(&host));  // tensor_slot only looks
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
}

GpuWeights upload_weights(const ModelWeights& host, GpuWeightFormat format) {
    GpuWeights g = upload_top(host, format);
    for (int li = 0; li < host.cfg.n_layers; ++li) upload_layer(g, li, host.layers[li]);
    return g;
}

GpuWeights random_weights(const ModelConfig& cfg, ExpertSlice slice, uint64_t seed,
                          GpuWeightFormat format) {
    GpuWeights g = build_top(cfg, slice, format, seed, nullptr);
    Builder b(seed, &g);
    for (int li = 0; li < cfg.n_layers; ++li) build_layer(b, g, li, nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    return g;
}

}  // namespace cpfill::cuda
