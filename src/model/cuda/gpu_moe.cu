// gpu_moe_route: router → routing → sort by expert → counts to the host; gpu_moe_experts:
// per-expert GEMMs → shared expert → combine.
#include <algorithm>
#include <numeric>
#include <vector>

#include "model/cuda/gpu_moe.h"
#include "ops/cuda/fp4.h"
#include "ops/cuda/grouped_fp8.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_dispatch.h"
#include "ops/cuda/moe_fp8.h"
#include "ops/cuda/rows.h"
#include "ops/gemm_plan_rows.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::cuda {

namespace oc = ops::cuda;

void gpu_moe_route(const GpuCtx& c, const GpuWeights& W, const GpuLayer& L, const bf16* y,
                   const int32_t* tokens, int64_t rows, GpuRouteScratch& r) {
    const ModelConfig& cfg = W.cfg;
    const int E = cfg.n_experts, K = cfg.top_k;
    const int64_t D = cfg.d_model;
    oc::gemm_bf16(*c.gemm, y, D, rows, D, L.gate.as<bf16>(), E, nullptr, r.logits, E, false,
                  c.stream);
    const bool hash = L.mlp == MlpType::Hash;
    if (hash) oc::hash_lookup(L.tid2eid.as<int64_t>(), tokens, rows, K, r.hash, c.stream);
    oc::route(r.logits, rows, E, K, hash ? nullptr : L.gate_bias.as<float>(),
              hash ? r.hash : nullptr, float(cfg.routed_scale), r.idx, r.weight, c.stream);
    oc::sort_by_expert(r.idx, rows * K, E, r.perm, r.counts, r.keys, r.ids, r.sort_scratch,
                       r.sort_bytes, c.stream);
    CPFILL_CUDA_CHECK(cudaMemcpyAsync(r.host_counts, r.counts, E * sizeof(int32_t),
                                      cudaMemcpyDeviceToHost, c.stream));
}

bool experts_grouped_fp8(const GpuLayer& L, bool allowed) {
    if (!allowed) return false;
    if (L.w13.fp4() && L.w2.fp4()) return true;
    return L.w13.fp8() && L.w2.fp8() && L.w13.blocks() == oc::Fp8Blocks::Tile128 &&
           L.w2.blocks() == oc::Fp8Blocks::Tile128;
}

bool experts_grouped_bf16(const GpuWeights& W, const GpuLayer& L, bool allowed) {
    return allowed && !L.w13.fp8() && !L.w13.fp4() && W.cfg.d_model % 128 == 0 &&
           W.width % 64 == 0 && W.cfg.n_experts <= kMaxGroupedExperts;
}

bool shared_expert_folded(const GpuLayer& L) {
    return (L.w13.fp8() || L.w13.fp4()) && L.shared_w13.fp8() && L.shared_w2.fp8();
}

int64_t gpu_moe_plan_experts(const GpuCtx& c, const GpuWeights& W, const GpuLayer& L,
                             int64_t max_rows) {
    const int64_t D = W.cfg.d_model, width = W.width;
    const bool fp8 = L.w13.fp8() || L.w13.fp4();
    // fp4 experts run as fp8 with 128×128 tiles (fp4_to_fp8_tiles); fp8 rows come in fours; bf16
    // experts have no blocks (blocks() refuses a storage that is not fp8).
    const oc::Fp8Blocks b13 = L.w13.fp8() ? L.w13.blocks() : oc::Fp8Blocks::Tile128;
    const oc::Fp8Blocks b2 = L.w2.fp8() ? L.w2.blocks() : oc::Fp8Blocks::Tile128;
    const int64_t step = fp8 ? oc::kExpertRowAlign : 1;
    max_rows = fp8 ? oc::padded_rows(max_rows) : max_rows;
    if (max_rows <= 0 || width <= 0) return 0;
    const int64_t el = fp8 ? 1 : 2;  // bytes per value of x, w and the activation
    DeviceBuffer x(max_rows * D * el), w13(2 * width * D * el), gu(max_rows * 2 * width * 2),
        act(max_rows * width * el), w2(D * width * el), op(max_rows * D * 2);
    DeviceBuffer xs(fp8 ? max_rows * (D / 128) * 4 : 0), as(fp8 ? max_rows * (width / 128) * 4 : 0),
        ws13(fp8 ? ops::fp8_scale_count(2 * width, D, b13) * 4 : 0),
        ws2(fp8 ? ops::fp8_scale_count(D, width, b2) * 4 : 0);
    for (DeviceBuffer* b : {&x, &w13, &gu, &act, &w2, &op, &xs, &as, &ws13, &ws2})
        if (b->bytes()) CPFILL_CUDA_CHECK(cudaMemsetAsync(b->as<void>(), 0, b->bytes(), c.stream));
    int64_t made = 0;
    for (int64_t n = step; n <= max_rows; n = ops::gemm_plan_rows(n) + step, ++made) {
        const int64_t m = std::min(ops::gemm_plan_rows(n), max_rows);
        if (fp8) {
            oc::gemm_fp8(*c.gemm, x.as<uint8_t>(), xs.as<float>(), m, D, w13.as<uint8_t>(),
                         ws13.as<float>(), b13, 2 * width, gu.as<bf16>(), nullptr, 2 * width,
                         c.stream);
            oc::gemm_fp8(*c.gemm, act.as<uint8_t>(), as.as<float>(), m, width, w2.as<uint8_t>(),
                         ws2.as<float>(), b2, D, op.as<bf16>(), nullptr, D, c.stream);
        } else {
            oc::linear_bf16(*c.gemm, x.as<bf16>(), m, D, w13.as<bf16>(), 2 * width, gu.as<bf16>(),
                            nullptr, false, c.stream);
            oc::linear_bf16(*c.gemm, act.as<bf16>(), m, width, w2.as<bf16>(), D, op.as<bf16>(),
                            nullptr, false, c.stream);
        }
    }
    CPFILL_CUDA_CHECK(cudaStreamSynchronize(c.stream));  // before the scratch is freed
    return made;
}

void gpu_moe_begin(const GpuCtx& c, const GpuExpertStreams& es, const GpuWeights& W,
                   const GpuLayer& L, const bf16* y, int64_t rows, cudaEvent_t routed,
                   GpuMoeScratch& s) {
    const int E = W.cfg.n_experts;
    const int64_t D = W.cfg.d_model, width = W.width;
    c.phase(Phase::Moe);
    if (L.w13.fp4()) {  // this layer's fp4 experts re-encoded into fp8 tiles (gpu_moe_experts)
        oc::fp4_to_fp8_tiles(L.w13.data.as<uint8_t>(), L.w13.scale.as<uint8_t>(), E, 2 * width, D,
                             s.w13_q, s.w13_s, s.tile_k, nullptr, c.stream);
        oc::fp4_to_fp8_tiles(L.w2.data.as<uint8_t>(), L.w2.scale.as<uint8_t>(), E, D, width, s.w2_q,
                             s.w2_s, s.tile_k + oc::fp4_tile_scratch(E, 2 * width, D), nullptr,
                             c.stream);
    }
    // The router's stream first: its small kernels would otherwise wait for the multiprocessors
    // behind the shared expert's GEMM, which fills them all (measured, session 48).
    CPFILL_CUDA_CHECK(cudaStreamWaitEvent(c.stream, routed, 0));
    // Where the expert streams start: y and the routing have arrived, the weights are ready and
    // every earlier reader of this scratch (the previous sub-batch's experts, joined back) is
    // behind.
    CPFILL_CUDA_CHECK(cudaEventRecord(es.fork, c.stream));
    if (shared_expert_folded(L)) return;
    gpu_linear(c, L.shared_w13, y, D, rows, s.gu_shared, nullptr, 2 * width);
    oc::swiglu(s.gu_shared, rows, width, float(W.cfg.swiglu_limit), nullptr, s.act_shared,
               c.stream);
    gpu_linear(c, L.shared_w2, s.act_shared, width, rows, nullptr, s.acc, D);
}

void gpu_moe_experts(const GpuCtx& c, const GpuExpertStreams& es, const GpuWeights& W,
                     const GpuLayer& L, const bf16* y, int64_t rows, const GpuRouteScratch& r,
                     GpuMoeScratch& s, bf16* out) {
    const ModelConfig& cfg = W.cfg;
    const int E = cfg.n_experts, K = cfg.top_k;
    const int64_t D = cfg.d_model, width = W.width, n_assign = rows * K;
    const float limit = float(cfg.swiglu_limit);
    const bool fp8 = L.w13.fp8() || L.w13.fp4();
    c.phase(Phase::Moe);
    // The routed experts' fp8 weights: as held, or this layer's fp4 experts re-encoded.
    struct Fp8Weights {
        const uint8_t* q;
        const float* s;
        int64_t spm;
        oc::Fp8Blocks blocks;
    } w13{}, w2{};
    if (L.w13.fp4()) {  // re-encoded by gpu_moe_begin
        const oc::Fp8Blocks t = oc::Fp8Blocks::Tile128;
        w13 = {s.w13_q, s.w13_s, ops::fp8_scale_count(2 * width, D, t), t};
        w2 = {s.w2_q, s.w2_s, ops::fp8_scale_count(D, width, t), t};
    } else if (fp8) {
        w13 = {L.w13.data.as<uint8_t>(), L.w13.scale.as<float>(), L.w13.scales_per_matrix(),
               L.w13.blocks()};
        w2 = {L.w2.data.as<uint8_t>(), L.w2.scale.as<float>(), L.w2.scales_per_matrix(),
              L.w2.blocks()};
    }
    // The shared expert as expert E (shared_expert_folded): every row, after the routed ones.
    const bool fold = shared_expert_folded(L);
    const int64_t shared_rows = fold ? rows : 0;
    const int En = fold ? E + 1 : E;  // experts in the gathered rows
    // Each expert's first row: in the sorted assignments, and in the padded rows of fp8 experts.
    std::vector<int64_t> first(E + 2, 0), pfirst(E + 2, 0);
    for (int e = 0; e < E; ++e) {
        const int64_t m = r.host_counts[e];
        CPFILL_CHECK(m >= 0 && m <= rows && first[e] + m <= n_assign,
                     "expert {}: {} rows of {} assignments", e, m, n_assign);
        first[e + 1] = first[e] + m;
        pfirst[e + 1] = pfirst[e] + (fp8 ? oc::padded_rows(m) : m);
    }
    CPFILL_CHECK(first[E] == n_assign, "expert counts sum to {}, expected {}", first[E], n_assign);
    first[E + 1] = first[E] + shared_rows;
    pfirst[E + 1] = pfirst[E] + oc::padded_rows(shared_rows);
    // Routed experts: cpfill's grouped fp8 GEMM (gate_up, one SwiGLU, down) on the compute stream
    // before the shared expert — a persistent kernel that fills every multiprocessor, which a GEMM
    // beside it would only delay (measured: 2% slower at 64k tokens); or beside the shared expert
    // cuBLAS's grouped GEMMs on expert stream 0, or a GEMM pair per expert, largest first, each on
    // the expert stream with the fewest rows so far. Every expert works on its own rows of every
    // buffer, so they never touch the same memory.
    // (A folded shared expert's matrices are 128×128 tiles: gpu_storage makes no other fp8.)
    const bool fp8_grouped =
        experts_grouped_fp8(L, es.fp8_grouped) &&
        (!fold || (L.shared_w13.blocks() == oc::Fp8Blocks::Tile128 &&
                   L.shared_w2.blocks() == oc::Fp8Blocks::Tile128)) &&
        (fold || es.fp8_grouped_max_mean_rows == 0 || n_assign <= es.fp8_grouped_max_mean_rows * E);
    // bf16 experts in the same kernel (grouped_gemm_bf16: dense rows, no scales).
    const bool bf16_grouped =
        experts_grouped_bf16(W, L, es.bf16_grouped) &&
        (es.bf16_grouped_max_mean_rows == 0 || n_assign <= es.bf16_grouped_max_mean_rows * E);
    const bool grouped = (es.grouped && !fp8 && !bf16_grouped) || fp8_grouped;
    const int ns = fp8_grouped || bf16_grouped ? 0 : grouped ? 1 : es.count;
    // The gather by expert: on the compute stream before a grouped kernel there; before the expert
    // streams on stream 0, which starts at gpu_moe_begin's fork, so that it does not wait for the
    // shared expert queued on the compute stream since (the routing it reads is complete: the host
    // waited for it before this call).
    const cudaStream_t gs = ns > 0 ? es.stream[0] : c.stream;
    if (ns > 0) CPFILL_CUDA_CHECK(cudaStreamWaitEvent(gs, es.fork, 0));
    if (fp8) {
        oc::expert_offsets(r.counts, E, s.first, s.pfirst, gs, shared_rows);
        oc::gather_quant_fp8(y, D, r.perm, K, r.weight, r.counts, s.first, s.pfirst, E, pfirst[En],
                             s.xq, s.xs, s.sp, s.inv, gs, shared_rows);
    } else {
        oc::gather_by_expert(y, D, r.perm, n_assign, K, r.weight, s.xp, s.sp, s.inv, gs);
    }
    if (ns > 1) {
        CPFILL_CUDA_CHECK(cudaEventRecord(es.join[0], gs));  // the gathered rows
        for (int i = 1; i < ns; ++i)
            CPFILL_CUDA_CHECK(cudaStreamWaitEvent(es.stream[i], es.join[0], 0));
    }
    if (fp8_grouped) {
        const cudaStream_t st = c.stream;
        oc::GroupedFp8Gemm g;
        g.x = s.xq;
        g.xs = s.xs;
        g.n_pad = pfirst[En];
        g.pfirst = s.pfirst;
        g.n_experts = En;
        g.w = w13.q;
        g.ws = w13.s;
        g.ws_per_expert = w13.spm;
        if (fold) {
            g.w_last = L.shared_w13.data.as<void>();
            g.ws_last = L.shared_w13.scale.as<float>();
        }
        g.in = D;
        g.out = 2 * width;
        g.y = s.gu;
        oc::grouped_gemm_fp8(g, st);
        oc::swiglu_quant_fp8_experts(s.gu, pfirst[En], width, limit, s.sp, s.pfirst, En, s.aq, s.as,
                                     st);
        g.x = s.aq;
        g.xs = s.as;
        g.w = w2.q;
        g.ws = w2.s;
        g.ws_per_expert = w2.spm;
        if (fold) {
            g.w_last = L.shared_w2.data.as<void>();
            g.ws_last = L.shared_w2.scale.as<float>();
        }
        g.in = width;
        g.out = D;
        g.y = s.op;
        oc::grouped_gemm_fp8(g, st);
    } else if (bf16_grouped) {
        const cudaStream_t st = c.stream;
        oc::expert_offsets(r.counts, E, s.first, s.pfirst, st);  // first: the dense row offsets
        oc::GroupedBf16Gemm g;
        g.x = s.xp;
        g.rows = n_assign;
        g.first = s.first;
        g.n_experts = E;
        g.w = L.w13.bf16();
        g.in = D;
        g.out = 2 * width;
        g.y = s.gu;
        oc::grouped_gemm_bf16(g, st);
        oc::swiglu(s.gu, n_assign, width, limit, s.sp, s.act, st);
        g.x = s.act;
        g.w = L.w2.bf16();
        g.in = width;
        g.out = D;
        g.y = s.op;
        oc::grouped_gemm_bf16(g, st);
    } else if (grouped) {
        const cudaStream_t st = es.stream[0];
        es.grouped->experts(r.counts, r.host_counts, E, s.xp, D, L.w13.bf16(), 2 * width, s.gu, st);
        oc::swiglu(s.gu, n_assign, width, limit, s.sp, s.act, st);
        es.grouped->experts(r.counts, r.host_counts, E, s.act, width, L.w2.bf16(), D, s.op, st);
    } else {
        // Largest first; the folded shared expert (every row) is one of them.
        std::vector<int> order(En);
        std::iota(order.begin(), order.end(), 0);
        const auto count = [&](int e) { return first[e + 1] - first[e]; };
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return count(a) > count(b); });
        int64_t load[kMaxExpertStreams] = {};
        for (const int e : order) {
            const int64_t m = count(e);
            if (m == 0) break;
            const int si = static_cast<int>(std::min_element(load, load + ns) - load);
            load[si] += m;
            const cudaStream_t st = es.stream[si];
            oc::GemmContext& g = *es.gemm[si];
            const int64_t off = pfirst[e], rows_e = pfirst[e + 1] - pfirst[e];
            bf16* gu = s.gu + off * 2 * width;
            bf16* op = s.op + off * D;
            if (fp8) {
                const bool sh = e == E;
                const Fp8Weights e13 =
                    sh ? Fp8Weights{L.shared_w13.data.as<uint8_t>(), L.shared_w13.scale.as<float>(),
                                    0, L.shared_w13.blocks()}
                       : Fp8Weights{w13.q + e * 2 * width * D, w13.s + e * w13.spm, 0, w13.blocks};
                const Fp8Weights e2 =
                    sh ? Fp8Weights{L.shared_w2.data.as<uint8_t>(), L.shared_w2.scale.as<float>(),
                                    0, L.shared_w2.blocks()}
                       : Fp8Weights{w2.q + e * D * width, w2.s + e * w2.spm, 0, w2.blocks};
                oc::gemm_fp8(g, static_cast<uint8_t*>(s.xq) + off * D, s.xs + off * (D / 128),
                             rows_e, D, e13.q, e13.s, e13.blocks, 2 * width, gu, nullptr, 2 * width,
                             st);
                uint8_t* aq = static_cast<uint8_t*>(s.aq) + off * width;
                float* as = s.as + off * (width / 128);
                oc::swiglu_quant_fp8(gu, rows_e, width, limit, s.sp + off, aq, as, st);
                oc::gemm_fp8(g, aq, as, rows_e, width, e2.q, e2.s, e2.blocks, D, op, nullptr, D,
                             st);
                continue;
            }
            bf16* act = s.act + off * width;
            oc::linear_bf16(g, s.xp + off * D, m, D, L.w13.bf16() + e * 2 * width * D, 2 * width,
                            gu, nullptr, false, st);
            oc::swiglu(gu, m, width, limit, s.sp + off, act, st);
            oc::linear_bf16(g, act, m, width, L.w2.bf16() + e * D * width, D, op, nullptr, false,
                            st);
        }
    }
    for (int i = 0; i < ns; ++i) {
        CPFILL_CUDA_CHECK(cudaEventRecord(es.join[i], es.stream[i]));
        CPFILL_CUDA_CHECK(cudaStreamWaitEvent(c.stream, es.join[i], 0));
    }
    if (fold)
        oc::combine_experts(s.op + pfirst[E] * D, s.op, s.inv, rows, K, D, out, c.stream);
    else
        oc::combine_experts(s.acc, s.op, s.inv, rows, K, D, out, c.stream);
}

}  // namespace cpfill::cuda
