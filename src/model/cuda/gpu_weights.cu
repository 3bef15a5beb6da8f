// GpuWeights: upload from host fp32 weights, or generation on the device, both walking the weight
// table (io/weight_specs.h).
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "model/cuda/gpu_weights.h"
#include "model/weight_bytes.h"
#include "ops/cuda/fp4.h"
#include "ops/cuda/fp8.h"
#include "ops/cuda/indexer_hopper.h"
#include "ops/cuda/stored_decode.h"
#include "ops/rope.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::cuda {

namespace {

// Writes matrix e of a weight as device f32 into its second argument (a staging buffer).
using MatrixSource = std::function<void(int64_t e, float* dev)>;

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

// Device f32 (or a plain copy) of a weight's stored bytes, through the StoredReader: each piece
// is copied to a device staging buffer (only the columns asked for, widened to whole scale
// blocks and bytes) and decoded there, all queued on the default stream without waiting: a CUDA
// host function after a piece's copies gives its slot back. Each read has a bad-element slot on
// the device; check() looks at them all at once, and a bad element is read again on the host,
// whose loader gives its error (a non-finite value, a scale that is not a power of two).
class StoredFill {
  public:
    StoredFill(const Checkpoint& ck, StoredReader& rd) : ck_(ck), rd_(rd) {
        CPFILL_CUDA_CHECK(cudaMalloc(&bad_, kBadSlots * sizeof(*bad_)));
        raw_ = DeviceBuffer(rd_.slot_bytes());
    }
    ~StoredFill() {
        cudaDeviceSynchronize();  // host functions still queued refer to rd_
        cudaFree(bad_);
    }
    StoredFill(const StoredFill&) = delete;
    StoredFill& operator=(const StoredFill&) = delete;

    const StoredSlab& slab(const std::string& name) { return rd_.slab(name); }
    Tensor i64(const std::string& name) const { return ck_.get_i64(name); }

    // Rows [r0, r1) × columns [c0, c1) of weight `name` (seen as 2-D) → dst, device f32 with
    // c1 − c0 per row.
    void f32(const std::string& name, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float* dst) {
        const StoredSlab& sl = slab(name);
        CPFILL_CHECK(0 <= c0 && c0 <= c1 && c1 <= sl.cols, "weight {}: columns [{}, {}) of {}",
                     name, c0, c1, sl.cols);
        unsigned long long* bad = next_bad(name);
        using K = StoredSlab::Kind;
        const bool fp4 = sl.kind == K::Fp4;
        const int64_t es = sl.kind == K::Float ? static_cast<int64_t>(dtype_size(sl.dtype)) : 1;
        const int64_t col0 = fp4 ? c0 & ~int64_t{1} : c0;
        const int64_t b0 = fp4 ? col0 / 2 : c0 * es, b1 = fp4 ? (c1 + 1) / 2 : c1 * es;
        const int64_t ssize = sl.sdtype == DType::F32 ? 4 : 1;
        const int64_t sc0 = sl.s ? c0 / sl.col_block : 0;
        const int64_t sc1 = sl.s && c1 > c0 ? (c1 - 1) / sl.col_block + 1 : sc0;
        rd_.read(
            name, r0, r1,
            [&](const PieceBytes& p) {
                // Every piece is given back below, even one with nothing to copy (c0 == c1).
                const int64_t a = std::max(r0, p.r0), b = std::min(r1, p.r1);
                const size_t wbytes = static_cast<size_t>((b1 - b0) * (b - a));
                const size_t soff = (wbytes + 255) / 256 * 256;
                const auto [s0, s1] = sl.scale_rows(a, b);
                const size_t need = soff + static_cast<size_t>((s1 - s0) * (sc1 - sc0) * ssize);
                if (raw_.bytes() < need) {  // a piece read on the spot, larger than the slots
                    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());  // the old buffer's readers
                    raw_ = DeviceBuffer(need);
                }
                ops::cuda::StagedSlab st;
                st.kind = sl.kind == K::Fp8         ? ops::cuda::StagedSlab::Fp8
                          : fp4                     ? ops::cuda::StagedSlab::Fp4
                          : sl.dtype == DType::BF16 ? ops::cuda::StagedSlab::BF16
                          : sl.dtype == DType::F16  ? ops::cuda::StagedSlab::F16
                                                    : ops::cuda::StagedSlab::F32;
                st.w = raw_.as<uint8_t>();
                st.w_pitch = b1 - b0;
                st.w_row0 = a;
                st.w_col0 = col0;
                copy_2d(raw_.as<uint8_t>(), b1 - b0, p.w + (a - p.r0) * sl.row_bytes + b0,
                        sl.row_bytes, b1 - b0, b - a);
                if (sl.s) {
                    const int64_t ps0 = sl.scale_rows(p.r0, p.r1).first, srb = sl.scale_row_bytes();
                    st.s = raw_.as<uint8_t>() + soff;
                    st.s_f32 = ssize == 4;
                    st.s_pitch = (sc1 - sc0) * ssize;
                    st.s_row0 = s0;
                    st.s_col0 = sc0;
                    st.s_row_off = sl.s_row_off;
                    st.row_block = sl.row_block;
                    st.col_block = sl.col_block;
                    copy_2d(raw_.as<uint8_t>() + soff, st.s_pitch,
                            p.s + (s0 - ps0) * srb + sc0 * ssize, srb, st.s_pitch, s1 - s0);
                }
                give_back(p);  // once the copies are done
                ops::cuda::decode_stored(st, a, b, c0, c1, sl.cols, dst + (a - r0) * (c1 - c0),
                                         c1 - c0, bad, nullptr);
            },
            true);
    }
    // The whole weight `name` (n values, checked by the caller) into dst as bf16 or f32 when it is
    // stored so: a copy, checked for non-finite values. False (nothing done) when it is stored
    // otherwise.
    bool copy(const std::string& name, void* dst, bool bf16, int64_t n) {
        const StoredSlab& sl = slab(name);
        if (sl.kind != StoredSlab::Kind::Float || sl.dtype != (bf16 ? DType::BF16 : DType::F32))
            return false;
        unsigned long long* bad = next_bad(name);
        rd_.read(
            name, 0, sl.rows,
            [&](const PieceBytes& p) {
                CPFILL_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(dst) + p.r0 * sl.row_bytes,
                                                  p.w,
                                                  static_cast<size_t>((p.r1 - p.r0) * sl.row_bytes),
                                                  cudaMemcpyHostToDevice, nullptr));
                give_back(p);
            },
            true);
        ops::cuda::check_finite(dst, bf16, n, bad, nullptr);
        return true;
    }
    // Throws the host loader's error for the first bad element of the reads since the last
    // check, if any (waits for them).
    void check() {
        if (names_.empty()) return;
        std::vector<unsigned long long> bad(names_.size());
        CPFILL_CUDA_CHECK(
            cudaMemcpy(bad.data(), bad_, bad.size() * sizeof(bad[0]), cudaMemcpyDeviceToHost));
        const std::vector<std::string> names = std::move(names_);
        names_.clear();
        for (size_t i = 0; i < bad.size(); ++i) {
            if (bad[i] == ~0ull) continue;
            const int64_t cols = slab(names[i]).cols;
            const int64_t r = static_cast<int64_t>(bad[i]) / cols;
            const int64_t c = static_cast<int64_t>(bad[i]) % cols;
            float v = 0;
            ck_.read_f32_block(names[i], r, r + 1, c, c + 1, &v);  // throws the host's error
            CPFILL_FAIL(
                "{}: weight {} element [{}, {}]: {} on the host but not finite as "
                "decoded on the GPU",
                ck_.dir(), names[i], r, c, v);
        }
    }

  private:
    static void copy_2d(uint8_t* dst, int64_t dpitch, const uint8_t* src, int64_t spitch,
                        int64_t width, int64_t height) {
        if (width <= 0 || height <= 0) return;
        CPFILL_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dpitch), src,
                                            static_cast<size_t>(spitch), static_cast<size_t>(width),
                                            static_cast<size_t>(height), cudaMemcpyHostToDevice,
                                            nullptr));
    }
    // The bad-element slot of a new read of `name` (reset on the stream); checks the earlier
    // reads first when the slots are used up.
    unsigned long long* next_bad(const std::string& name) {
        if (names_.size() == kBadSlots) check();
        unsigned long long* b = bad_ + names_.size();
        names_.push_back(name);
        ops::cuda::reset_bad(b, nullptr);
        return b;
    }
    // Gives piece p's ring slot back once the copies queued so far have run (a host function on
    // the stream); memory of the read's own needs nothing (see PieceBytes).
    void give_back(const PieceBytes& p) {
        if (p.entry < 0) return;
        auto* job = new Release{&rd_, p.entry};
        CPFILL_CUDA_CHECK(cudaLaunchHostFunc(
            nullptr,
            [](void* j) {
                std::unique_ptr<Release> r(static_cast<Release*>(j));
                r->rd->release(r->entry);
            },
            job));
    }
    struct Release {
        StoredReader* rd;
        int64_t entry;
    };
    static constexpr size_t kBadSlots = 4096;
    const Checkpoint& ck_;
    StoredReader& rd_;
    DeviceBuffer raw_;
    unsigned long long* bad_ = nullptr;
    std::vector<std::string> names_;  // the reads since the last check, one bad slot each
};

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
    // `n` values of weight `name` at its GPU dtype from the checkpoint's stored bytes.
    void fill_stored(DeviceBuffer& dst, DType dtype, int64_t n, const std::string& name,
                     StoredFill& sf) {
        const bool bf16 = dtype == DType::BF16;
        const StoredSlab& sl = sf.slab(name);
        CPFILL_CHECK(sl.rows * sl.cols == n, "weight {}: {} stored values for {} on the GPU", name,
                     sl.rows * sl.cols, n);
        dst = DeviceBuffer(n * (bf16 ? 2 : 4));
        if (!sf.copy(name, dst.as<void>(), bf16, n)) {
            if (bf16) {
                DeviceBuffer f(n * 4);
                sf.f32(name, 0, sl.rows, 0, sl.cols, f.as<float>());
                ops::cuda::f32_to_bf16(f.as<float>(), dst.as<void>(), n, nullptr);
                CPFILL_CUDA_CHECK(cudaDeviceSynchronize());  // before f is freed
            } else {
                sf.f32(name, 0, sl.rows, 0, sl.cols, dst.as<float>());
            }
        }
        g_->bytes += dst.bytes();
    }
    // Weight `spec` of a rank with expert slice `slice` (not a matrix of GpuLayer).
    void operator()(DeviceBuffer& dst, const WeightSpec& spec, const ModelConfig& cfg,
                    ExpertSlice slice, const Tensor* host) {
        fill(dst, gpu_dtype(spec), rank_numel(spec, cfg, slice), spec.name, host, spec.init);
    }
    // `count` matrices [rows, cols] stored as `st`, named `name` (its random stream runs on over
    // the matrices); matrix e written as device f32 by src(e, staging), or at random when src is
    // empty. Fp8Row matrices are first tried as Fp8Tile (fewer scales, GEMMs 1.3× faster:
    // docs/fp8.md), and kept so when every value came out exact.
    void matrix(GpuMatrix& m, GpuStorage st, int64_t count, int64_t rows, int64_t cols,
                const std::string& name, WeightInit init, const MatrixSource& src) {
        if (st == GpuStorage::Fp8Row && !src) {
            // Random weights are defined by their rounding (the values the release would ship):
            // tiles, nothing counted.
            store(m, GpuStorage::Fp8Tile, count, rows, cols, name, init, src);
            return;
        }
        if (st == GpuStorage::Fp8Row) {
            const unsigned long long before = inexact();
            const size_t bytes = g_->bytes;
            const uint64_t values = g_->fp8_values;
            store(m, GpuStorage::Fp8Tile, count, rows, cols, name, init, src);
            if (inexact() == before) return;
            set_inexact(before);  // not exact in tiles: (row, 128) blocks instead
            g_->bytes = bytes;
            g_->fp8_values = values;
        }
        store(m, st, count, rows, cols, name, init, src);
    }
    void store(GpuMatrix& m, GpuStorage st, int64_t count, int64_t rows, int64_t cols,
               const std::string& name, WeightInit init, const MatrixSource& src) {
        m.storage = st;
        m.rows = rows;
        m.cols = cols;
        const int64_t per = rows * cols;
        if (st == GpuStorage::Bf16) {
            m.data = DeviceBuffer(count * per * 2);
            if (src) {
                DeviceBuffer staging(per * 4);
                for (int64_t e = 0; e < count; ++e) {
                    src(e, staging.as<float>());
                    ops::cuda::f32_to_bf16(staging.as<float>(), m.data.as<uint8_t>() + e * per * 2,
                                           per, nullptr);
                }
                CPFILL_CUDA_CHECK(cudaDeviceSynchronize());  // before the staging is freed
            } else {
                random(m.data.as<void>(), true, count * per, name, init, 0);
            }
            g_->bytes += m.data.bytes();
            return;
        }
        if (st == GpuStorage::Fp4) {
            store_fp4(m, count, rows, cols, name, init, src);
            return;
        }
        CPFILL_CHECK(is_fp8(st), "weight {}: a matrix is bf16, fp8 or fp4", name);
        const int64_t spm = m.scales_per_matrix();
        m.data = DeviceBuffer(count * per);
        m.scale = DeviceBuffer(count * spm * 4);
        DeviceBuffer staging(per * 4);
        ensure_counter();
        for (int64_t e = 0; e < count; ++e) {
            if (src)
                src(e, staging.as<float>());
            else
                random(staging.as<void>(), false, per, name, init, e * per);
            ops::cuda::quantize_weight_fp8(
                staging.as<float>(), rows, cols, m.blocks(), m.data.as<uint8_t>() + e * per,
                m.scale.as<float>() + e * spm, src ? counter_ : nullptr, nullptr);
        }
        CPFILL_CUDA_CHECK(cudaDeviceSynchronize());  // before the staging buffer is freed
        if (src) g_->fp8_values += static_cast<uint64_t>(count * per);
        g_->bytes += m.data.bytes() + m.scale.bytes();
    }
    // Packed fp4 (routed experts): quantised from f32 on the device; from a checkpoint, also the
    // re-encoding to fp8 tiles the GEMMs will read is tried once and its inexact values counted.
    void store_fp4(GpuMatrix& m, int64_t count, int64_t rows, int64_t cols, const std::string& name,
                   WeightInit init, const MatrixSource& src) {
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
            if (src)
                src(e, staging.as<float>());
            else
                random(staging.as<void>(), false, per, name, init, e * per);
            ops::cuda::quantize_weight_fp4(staging.as<float>(), rows, cols, q, s,
                                           src ? counter_ : nullptr, nullptr);
            if (src)
                ops::cuda::fp4_to_fp8_tiles(q, s, 1, rows, cols, q8.as<uint8_t>(), s8.as<float>(),
                                            tk.as<int>(), counter_, nullptr);
        }
        CPFILL_CUDA_CHECK(cudaDeviceSynchronize());  // before the staging buffers are freed
        if (src) g_->fp8_values += static_cast<uint64_t>(count * per);
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

// Matrix sources from host f32 tensors: matrix e is host_of(e) ([rows · cols] values).
MatrixSource host_source(const std::string& name, int64_t per,
                         std::function<const Tensor*(int64_t)> host_of) {
    return [name, per, host_of](int64_t e, float* dev) {
        const Tensor* t = host_of(e);
        CPFILL_CHECK(t && t->defined() && t->numel() == per,
                     "weight {}: {} values on the host, expected {}", name,
                     t && t->defined() ? t->numel() : 0, per);
        CPFILL_CUDA_CHECK(cudaMemcpy(dev, t->f32(), per * 4, cudaMemcpyHostToDevice));
    };
}

// Layer `li` from the weight table: every weight of the layer into its slot, from the host
// weights `h` (a rank's, as load_rank_weights makes them), from the checkpoint's stored bytes
// (`sf`), or at random when both are null. The routed experts' slices go into one matrix buffer
// per layer: w13 [E][2 · width, d_model], w2 [E][d_model, width]; the shared expert's w1 and w3
// into one [2 · width, d_model]. The stored reads come in the order stored_upload_plan lists.
void build_layer(Builder& b, GpuWeights& gw, int li, LayerWeights* h, StoredFill* sf) {
    const ModelConfig& cfg = gw.cfg;
    GpuLayer& g = gw.layers[li];
    g.type = cfg.layer_types[li];
    g.mlp = cfg.mlp_types[li];
    const int64_t D = cfg.d_model, E = cfg.n_experts, width = gw.width;
    const int64_t a = cfg.moe_dim * gw.slice.part / gw.slice.parts;  // the slice's first unit
    for (const WeightSpec& spec : layer_weight_specs(cfg, li)) {
        const Tensor* host = h ? opt(tensor_slot(*h, spec)) : nullptr;
        if (spec.slot == WeightSlot::Tid2eid) {
            Tensor ids;
            if (sf) ids = sf->i64(spec.name);
            build_tid2eid(g.tid2eid, cfg, li, sf ? &ids : host, b.seed(), b.bytes());
            continue;
        }
        if (spec.slot == WeightSlot::W3 || spec.expert > 0) continue;  // with w1 / expert 0
        const GpuStorage st = gpu_storage(spec, cfg, gw.slice, gw.format);
        const bool w13 = spec.slot == WeightSlot::W1;
        const bool expert = spec.shard != CpShard::Replicated;  // routed or shared
        const int64_t rows = expert ? (w13 ? 2 * width : D) : spec.shape[0];
        const int64_t cols =
            expert ? (w13 ? D : width) : (spec.shape.size() > 1 ? spec.shape[1] : 1);
        // Matrix e of this weight (routed: expert e; otherwise the one matrix) from the checkpoint.
        const auto stored_matrix = [&, spec](int64_t e, float* dev) {
            const int ex = spec.expert < 0 ? -1 : static_cast<int>(e);  // −1: the shared expert
            if (!expert) {
                sf->f32(spec.name, 0, rows, 0, cols, dev);
            } else if (w13) {
                sf->f32(expert_weight_name(li, ex, WeightSlot::W1), a, a + width, 0, D, dev);
                sf->f32(expert_weight_name(li, ex, WeightSlot::W3), a, a + width, 0, D,
                        dev + width * D);
            } else {
                sf->f32(expert_weight_name(li, ex, WeightSlot::W2), 0, D, a, a + width, dev);
            }
        };
        if (spec.expert == 0) {  // all routed experts at once
            const std::vector<Tensor>* parts = h ? (w13 ? &h->moe.w13 : &h->moe.w2) : nullptr;
            CPFILL_CHECK(!parts || static_cast<int64_t>(parts->size()) == E,
                         "upload: layer {} has {} routed experts on the host, expected {}", li,
                         parts ? parts->size() : 0, E);
            MatrixSource src;
            if (sf)
                src = stored_matrix;
            else if (parts)
                src = host_source(spec.name, rows * cols,
                                  [parts](int64_t e) { return &(*parts)[e]; });
            b.matrix(w13 ? g.w13 : g.w2, st, E, rows, cols, spec.name, spec.init, src);
            continue;
        }
        CPFILL_CHECK(!h || host, "upload: weight {} is missing from the host weights", spec.name);
        if (GpuMatrix* m = gpu_matrix(g, spec)) {
            MatrixSource src;
            if (sf)
                src = stored_matrix;
            else if (host)
                src = host_source(spec.name, rows * cols, [host](int64_t) { return host; });
            b.matrix(*m, st, 1, rows, cols, spec.name, spec.init, src);
            continue;
        }
        if (sf)
            b.fill_stored(gpu_slot(g, spec), gpu_dtype(spec), rank_numel(spec, cfg, gw.slice),
                          spec.name, *sf);
        else
            b(gpu_slot(g, spec), spec, cfg, gw.slice, host);
    }
    b.finish();
}

// The checks, the top-level tensors and the RoPE tables; `layers` sized but empty.
GpuWeights build_top(const ModelConfig& cfg, ExpertSlice slice, GpuWeightFormat format,
                     uint64_t seed, ModelWeights* host, StoredFill* sf = nullptr) {
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
    g.indexer_fp8 =
        gpu_indexer_fp8(GpuIndexer::Auto, format, ops::cuda::indexer_hopper::supported());
    g.width = slice_width(cfg.moe_dim, slice);
    Builder b(seed, &g);
    for (const WeightSpec& spec : weight_specs(cfg)) {
        if (spec.layer >= 0) continue;
        const Tensor* t = host ? opt(tensor_slot(*host, spec)) : nullptr;
        CPFILL_CHECK(!host || t, "upload: weight {} is missing from the host weights", spec.name);
        if (sf)
            b.fill_stored(gpu_top_slot(g, spec), gpu_dtype(spec), rank_numel(spec, cfg, slice),
                          spec.name, *sf);
        else
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
    build_layer(b, g, li, const_cast<LayerWeights*>(&host), nullptr);  // tensor_slot only looks
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
}

GpuWeights upload_weights(const ModelWeights& host, GpuWeightFormat format) {
    GpuWeights g = upload_top(host, format);
    for (int li = 0; li < host.cfg.n_layers; ++li) upload_layer(g, li, host.layers[li]);
    return g;
}

std::vector<std::pair<std::string, const DeviceBuffer*>> device_buffers(const GpuWeights& gw) {
    std::vector<std::pair<std::string, const DeviceBuffer*>> out;
    const ModelConfig& cfg = gw.cfg;
    auto& w = const_cast<GpuWeights&>(gw);  // the slot maps only look
    for (const WeightSpec& spec : weight_specs(cfg))
        if (spec.layer < 0) out.emplace_back(spec.name, &gpu_top_slot(w, spec));
    out.emplace_back("inv_freq_main", &gw.inv_freq_main);
    out.emplace_back("inv_freq_compress", &gw.inv_freq_compress);
    for (int li = 0; li < cfg.n_layers && li < static_cast<int>(gw.layers.size()); ++li) {
        GpuLayer& g = w.layers[li];
        for (const WeightSpec& spec : layer_weight_specs(cfg, li)) {
            if (spec.slot == WeightSlot::W3 || spec.expert > 0) continue;
            GpuMatrix* m = spec.expert == 0 ? (spec.slot == WeightSlot::W1 ? &g.w13 : &g.w2)
                                            : gpu_matrix(g, spec);
            if (m) {
                out.emplace_back(spec.name + " (data)", &m->data);
                out.emplace_back(spec.name + " (scale)", &m->scale);
            } else {
                out.emplace_back(spec.name, &gpu_slot(g, spec));
            }
        }
    }
    return out;
}

StoredPlan stored_upload_plan(const Checkpoint& ck, const std::vector<ExpertSlice>& slices,
                              size_t piece_bytes) {
    const ModelConfig& cfg = ck.config();
    CPFILL_CHECK(!slices.empty(), "stored upload plan: no ranks");
    StoredPlan plan;
    // Rows [r0, r1) of weight `name`, in pieces on a grid from r0; users: the slices whose rows
    // [lo(i), hi(i)) meet a piece.
    const auto slab = [&](const std::string& name) -> const StoredSlab& {
        auto it = plan.slabs.find(name);
        if (it == plan.slabs.end()) it = plan.slabs.emplace(name, ck.slab(name)).first;
        return it->second;
    };
    const auto add = [&](const std::string& name, int64_t r0, int64_t r1,
                         const std::function<std::pair<int64_t, int64_t>(size_t)>& rows_of) {
        const StoredSlab& sl = slab(name);
        const int64_t step = rows_per_piece(sl, piece_bytes);
        for (int64_t p = r0; p < r1; p += step) {
            const int64_t q = std::min(r1, p + step);
            int users = 0;
            for (size_t i = 0; i < slices.size(); ++i) {
                const auto [lo, hi] = rows_of(i);
                users += lo < q && p < hi;
            }
            if (users == 0) continue;
            plan.pieces.push_back(StoredPiece{name, p, q, users});
            plan.max_piece_bytes = std::max(plan.max_piece_bytes, cuda::piece_bytes(sl, p, q));
            plan.stored_bytes += cuda::piece_stored_bytes(sl, p, q);
        }
    };
    const auto all_rows = [&](const std::string& name) {
        const int64_t rows = slab(name).rows;
        add(name, 0, rows, [rows](size_t) { return std::pair<int64_t, int64_t>{0, rows}; });
    };
    const auto hidden_rows = [&](const std::string& name) {  // w1 / w3: each slice's rows
        const auto rows_of = [&](size_t i) {
            const int64_t lo = cfg.moe_dim * slices[i].part / slices[i].parts;
            return std::pair<int64_t, int64_t>{lo, lo + slice_width(cfg.moe_dim, slices[i])};
        };
        int64_t r0 = cfg.moe_dim, r1 = 0;
        for (size_t i = 0; i < slices.size(); ++i) {
            r0 = std::min(r0, rows_of(i).first);
            r1 = std::max(r1, rows_of(i).second);
        }
        add(name, r0, r1, rows_of);
    };
    // In the order of build_top and build_layer.
    for (const WeightSpec& spec : weight_specs(cfg))
        if (spec.layer < 0) all_rows(spec.name);
    for (int li = 0; li < cfg.n_layers; ++li)
        for (const WeightSpec& spec : layer_weight_specs(cfg, li)) {
            if (spec.slot == WeightSlot::Tid2eid || spec.slot == WeightSlot::W3 || spec.expert > 0)
                continue;
            if (spec.shard == CpShard::Replicated) {
                all_rows(spec.name);
                continue;
            }
            const int count = spec.expert == 0 ? cfg.n_experts : 1;
            for (int e = 0; e < count; ++e) {
                const int ex = spec.expert < 0 ? -1 : e;  // −1: the shared expert
                if (spec.slot == WeightSlot::W2) {
                    all_rows(expert_weight_name(li, ex, WeightSlot::W2));  // columns of all rows
                } else {
                    hidden_rows(expert_weight_name(li, ex, WeightSlot::W1));
                    hidden_rows(expert_weight_name(li, ex, WeightSlot::W3));
                }
            }
        }
    return plan;
}

GpuWeights upload_stored_top(const Checkpoint& ck, ExpertSlice slice, GpuWeightFormat format,
                             StoredReader& rd) {
    StoredFill sf(ck, rd);
    GpuWeights g = build_top(ck.config(), slice, format, 0, nullptr, &sf);
    sf.check();
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    return g;
}

void upload_stored_layer(GpuWeights& g, int li, const Checkpoint& ck, StoredReader& rd) {
    CPFILL_CHECK(li >= 0 && li < static_cast<int>(g.layers.size()),
                 "upload_stored_layer: layer {} of a model with {} layers", li, g.layers.size());
    StoredFill sf(ck, rd);
    Builder b(0, &g);
    build_layer(b, g, li, nullptr, &sf);
    sf.check();
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
}

GpuWeights random_weights(const ModelConfig& cfg, ExpertSlice slice, uint64_t seed,
                          GpuWeightFormat format) {
    GpuWeights g = build_top(cfg, slice, format, seed, nullptr);
    Builder b(seed, &g);
    for (int li = 0; li < cfg.n_layers; ++li) build_layer(b, g, li, nullptr, nullptr);
    CPFILL_CUDA_CHECK(cudaDeviceSynchronize());
    return g;
}

}  // namespace cpfill::cuda
