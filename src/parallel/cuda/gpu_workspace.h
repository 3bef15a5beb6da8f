// The workspace of one GPU prefill on one rank (docs/conventions.md: memory planned up front): the
// per-sub-batch state, the shared scratch of the layer stages, the KV store and the head's
// buffers, carved in one fixed order from the rank's arena — or counted, for the memory plan and
// the out-of-memory check before any work.
#pragma once

#include <algorithm>
#include <vector>

#include "model/cuda/gpu_attention.h"
#include "model/cuda/gpu_moe.h"
#include "parallel/cuda/gpu_runner.h"
#include "parallel/exchange_plan.h"
#include "parallel/layout.h"

namespace cpfill::cuda {

// Counts what take() would hand out (the plan) without allocating.
struct CountingArena {
    size_t used = 0;
    template <class T>
    T* take(int64_t n) {
        used += arena_round(static_cast<size_t>(std::max<int64_t>(n, 0)) * sizeof(T));
        return nullptr;
    }
};

// A sub-batch's mHC residual [n, hc, d_model]: fp32 or bf16 (GpuRunOptions::residual).
struct ResidualRows {
    void* data = nullptr;
    bool is_bf16 = false;
    // f(float*) or f(bf16*), whichever h is: the ops of ops/cuda/mhc.h have an overload for each.
    template <class F>
    void visit(F&& f) const {
        if (is_bf16)
            f(static_cast<bf16*>(data));
        else
            f(static_cast<float*>(data));
    }
    size_t elem_bytes() const { return is_bf16 ? 2 : 4; }
};

struct SubState {
    int index = 0;
    int64_t row_offset = 0;   // first row in the chunk
    int64_t stream_row0 = 0;  // first row in the whole token stream (where records go)
    const Batch* batch = nullptr;
    CpLayout layout;
    Rows rows;      // host
    GpuRows grows;  // device positions + segments
    int64_t n = 0, padded = 0;
    ResidualRows h;                   // [n, hc, d_model]
    float* post = nullptr;            // [n, hc] (MoE site, lives from X to finish_moe)
    float* comb = nullptr;            // [n, hc, hc]
    int64_t* pos = nullptr;           // [n]
    int32_t* tokens_rm = nullptr;     // [padded]
    int32_t* tokens_local = nullptr;  // [n]
    // Per exchange of the block (parallel/exchange_plan.h, indexed by slot()): the buffers of its
    // collective, sized for the widest layer.
    bf16* send[kExchanges] = {};
    bf16* recv[kExchanges] = {};
    GpuRouteScratch route;  // this sub-batch's MoE routing (router stream → compute stream)
};

// Sizes of one run: the largest over its chunks (T: tokens of the largest chunk; max_len: of the
// longest request, which the KV store holds whole).
struct Dims {
    int64_t n_max = 0, p_max = 0, w_max = 0, T = 0, max_len = 0, n_wanted = 0, logit_rows = 0;
    // The indexer's scratch: queries per chunk of scores over the longest request's entries.
    int64_t score_rows = 0, index_entries = 0;
    int64_t sub_n[2] = {0, 0}, sub_p[2] = {0, 0};  // local and padded rows per sub-batch
    int64_t carry = 0;  // packed rows carried from one chunk to the next (0: one chunk)
};

// Packed rows of a request the compressors may still need from the chunk before: a CSA window
// pools its own ratio tokens and the ratio before it (overlap), an HCA window its own.
int64_t carry_rows(const ModelConfig& cfg);

int64_t max_packed_width(const ModelConfig& cfg);
Dims dims_of(const ModelConfig& cfg, const RunPlan& plan, int cp, const GpuRunOptions& opt);

// What the weights ask of the workspace: the activation scratch of fp8 linears (dense_fp8), the
// padded fp8 rows of the routed experts (experts_fp8).
struct WeightNeeds {
    bool dense_fp8 = false, experts_fp8 = false;
    bool experts_fp4 = false;  // a layer's experts re-encoded to fp8 (implies experts_fp8)
    // Some layer's shared expert runs as expert E of the fp8 experts (shared_expert_folded), or
    // on its own (the *_shared buffers and acc of GpuMoeScratch).
    bool shared_folded = false, shared_apart = true;
    // The indexer scores in fp8 (GpuWeights::indexer_fp8): its scratch also holds the quantised
    // keys and queries.
    bool indexer_fp8 = false;
};
WeightNeeds needs_of(const GpuWeights& w);
// The same before the weights exist (the memory plan), from the weight table.
WeightNeeds needs_of(const ModelConfig& cfg, ExpertSlice slice, GpuWeightFormat format,
                     GpuIndexer indexer = GpuIndexer::Auto);

struct Workspace {
    std::vector<SubState> subs;
    bf16* x = nullptr;           // [n_max, d_model]
    float* post_attn = nullptr;  // [n_max, hc]
    float* comb_attn = nullptr;  // [n_max, hc, hc]
    float* mixes = nullptr;      // mHC mixing products (or the fused post + pre's partial sums)
    bf16* attn_out = nullptr;    // [n_max, d_model]
    bf16* staging = nullptr;     // [T + cp, w_max] packed rows of the chunk, global order,
                                 // after Dims::carry rows that hold the chunk before's last rows
    std::vector<bf16*> carry;    // per layer [carry, w_max]: the last rows of the chunk before
    GpuAttnScratch attn;
    GpuMoeScratch moe;
    ops::cuda::Fp8LinearScratch fp8;  // dense fp8 linears (WeightNeeds::dense_fp8)
    GpuKvStore kv;
    bf16* z = nullptr;         // [n_max, d_model]
    bf16* zw = nullptr;        // [n_wanted, d_model]
    float* logits = nullptr;   // [logit_rows, vocab]
    void* rec_send = nullptr;  // [n_max, hc, d_model] fp32 (records only)
    void* rec_recv = nullptr;  // [p_max, hc, d_model] fp32
    // Copy-engine collectives (runtime/cuda/ce_comm.h): the peers' parts of a reduction, one
    // area for each communicator (the compute stream's, the comm stream's).
    void* ce_staging[2] = {nullptr, nullptr};
    size_t ce_staging_bytes = 0;
};

// Carves w from `a` (an Arena, or a CountingArena to size it); copy_engines: with the staging of
// copy-engine collectives.
template <class A>
void carve(A& a, Workspace& w, const ModelConfig& cfg, const RunPlan& plan, int cp, int64_t width,
           const GpuRunOptions& opt, WeightNeeds needs, bool copy_engines = false);

}  // namespace cpfill::cuda
