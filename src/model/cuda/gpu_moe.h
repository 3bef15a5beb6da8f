// The MoE sub-block on the GPU (docs/architecture.md §3.8; docs/design.md §4 step 5): router on all
// rows (learned or hash), the (token, expert) assignments sorted by expert, one GEMM pair per
// expert over its contiguous rows (this rank's slice of its width), the shared expert over all
// rows, and the weighted sum per token. The result is this rank's partial sum (bf16), which the
// reduce-scatter adds up over the ranks. Routing and expert work are two calls on two streams.
#pragma once

#include <cstdint>

#include "model/cuda/gpu_attention.h"
#include "ops/cuda/grouped_gemm.h"

namespace cpfill::cuda {

// Routing of one sub-batch (written by gpu_moe_route on the router stream, read by
// gpu_moe_experts on the compute stream).
struct GpuRouteScratch {
    float* logits = nullptr;         // [rows, n_experts]
    int64_t* hash = nullptr;         // [rows, top_k]
    int32_t* idx = nullptr;          // [rows · top_k]
    float* weight = nullptr;         // [rows · top_k]
    int32_t* perm = nullptr;         // [rows · top_k] assignments sorted by expert
    int32_t* keys = nullptr;         // [rows · top_k] sort scratch
    int32_t* ids = nullptr;          // [rows · top_k] sort scratch
    int32_t* counts = nullptr;       // device [n_experts]
    int32_t* host_counts = nullptr;  // pinned host [n_experts]
    void* sort_scratch = nullptr;
    size_t sort_bytes = 0;
};

// Expert work space, shared by the sub-batches (their MoE stages run one after the other). With
// fp8 experts the routed rows are padded per expert (ops/cuda/moe_fp8.h): R = max_padded_rows(rows
// · top_k, n_experts) rows (+ padded_rows(rows) when the shared expert is folded in as expert E),
// and xq / aq replace xp / act; else R = rows · top_k. The *_shared buffers and acc serve a shared
// expert that is not folded in.
struct GpuMoeScratch {
    int32_t* inv = nullptr;     // [rows · top_k]
    bf16* xp = nullptr;         // [R, d_model] (bf16 experts)
    float* sp = nullptr;        // [R]
    bf16* gu = nullptr;         // [R, 2 · width] routed: each expert its own rows
    bf16* act = nullptr;        // [R, width] (bf16 experts)
    bf16* op = nullptr;         // [R, d_model]
    void* xq = nullptr;         // e4m3 [R, d_model] (fp8 experts)
    float* xs = nullptr;        // [R · d_model / 128]
    void* aq = nullptr;         // e4m3 [R, width]
    float* as = nullptr;        // [R · width / 128]
    int32_t* first = nullptr;   // [n_experts + 2]
    int32_t* pfirst = nullptr;  // [n_experts + 2]
    // fp4 experts: the layer's experts re-encoded to e4m3 with Tile128 scales (fp4_to_fp8_tiles)
    uint8_t* w13_q = nullptr;    // [n_experts][2 · width, d_model]
    float* w13_s = nullptr;      // [n_experts][fp8_scale_count(2 · width, d_model, Tile128)]
    uint8_t* w2_q = nullptr;     // [n_experts][d_model, width]
    float* w2_s = nullptr;       // [n_experts][fp8_scale_count(d_model, width, Tile128)]
    int* tile_k = nullptr;       // fp4_tile_scratch of w13, then of w2
    bf16* gu_shared = nullptr;   // [rows, 2 · width]
    bf16* act_shared = nullptr;  // [rows, width]
    float* acc = nullptr;        // [rows, d_model]
};

// Streams the routed experts' GEMMs are spread over (one expert's GEMM pair alone fills only a
// third of an H200's SMs at 64k tokens: ~1,500 rows), each with its own cuBLASLt context, and the
// events that fork them from and join them back into the compute stream. `count` of the
// kMaxExpertStreams are used (GpuRunOptions::expert_streams); experts go to the stream with the
// fewest rows so far, largest first; or two grouped GEMMs on stream 0 (GpuRunOptions::expert_gemm).
constexpr int kMaxExpertStreams = 8;
constexpr int kMaxGroupedExperts = 1024;  // routed experts the grouped path takes
constexpr int64_t kGroupedFp8MaxMeanRows = 512;
constexpr int64_t kGroupedBf16MaxMeanRows = 256;
struct GpuExpertStreams {
    int count = kMaxExpertStreams;
    ops::cuda::GroupedGemm* grouped = nullptr;  // set: the grouped path of bf16 experts (stream 0)
    bool fp8_grouped = false;  // fp8 experts with Tile128 scales: ops/cuda/grouped_fp8.h
    // bf16 experts in the same kernel (grouped_gemm_bf16) on the compute stream, while a layer
    // has at most bf16_grouped_max_mean_rows rows per expert on average (0: any). `auto` sets
    // kGroupedBf16MaxMeanRows: measured on the H200 (flash slice, session 28 run 3, MoE phase)
    // the kernel won at 8k tokens (192 rows per expert: 28.1 against 31.0 ms) and lost from 16k
    // (384 rows: 50.8 against 46.8; 64k, 1,536 rows: 170.0 against 149.8).
    bool bf16_grouped = false;
    int64_t bf16_grouped_max_mean_rows = 0;
    // With fp8_grouped and a shared expert that runs apart (not shared_expert_folded): only while
    // a layer's mean routed rows per expert is at most this (0: any). `auto` sets
    // kGroupedFp8MaxMeanRows: measured on the H200 (flash slice, docs/fp8.md) the grouped kernel
    // won at 8k tokens, tied at 16k and 32k and lost 1% at 64k to the GEMM pairs on 4 streams, with
    // the shared expert beside them. Folded in, the grouped kernel runs at every length (session
    // 23: equal to the pairs from 32k, 12 ms faster at 8k).
    int64_t fp8_grouped_max_mean_rows = 0;
    cudaStream_t stream[kMaxExpertStreams] = {};
    ops::cuda::GemmContext* gemm[kMaxExpertStreams] = {};
    cudaEvent_t fork = nullptr;
    cudaEvent_t join[kMaxExpertStreams] = {};
};

// On c.stream (the router stream, so the host can wait for the counts without stalling the
// compute stream): router logits (fp32 out), learned or hash routing, the assignments sorted by
// expert, and the expert counts copied to r.host_counts. y bf16 [rows, d_model] (normed MoE
// input of every row, rank-major); tokens device int32 [rows] (hash routing).
void gpu_moe_route(const GpuCtx& c, const GpuWeights& W, const GpuLayer& L, const bf16* y,
                   const int32_t* tokens, int64_t rows, GpuRouteScratch& r);

// Whether layer L's routed experts run the grouped fp8 kernel (ops/cuda/grouped_fp8.h) when
// `allowed` (GpuExpertStreams::fp8_grouped): fp8 experts with 128×128 weight tiles, or fp4 experts
// (re-encoded to such tiles per layer).
bool experts_grouped_fp8(const GpuLayer& L, bool allowed);

// Whether layer L's routed experts run the grouped kernel with bf16 operands
// (ops/cuda/grouped_fp8.h grouped_gemm_bf16) when `allowed` (GpuExpertStreams::bf16_grouped): bf16
// experts, d_model a multiple of 128, the rank's expert width of 64, at most kMaxGroupedExperts.
bool experts_grouped_bf16(const GpuWeights& W, const GpuLayer& L, bool allowed);

// Whether layer L's shared expert runs as expert E of the routed fp8 experts (docs/fp8.md, "The
// shared expert as expert E"): routed experts fp8 (or fp4) and the shared expert's two matrices
// fp8. Its rows (every token, weight 1) then follow the routed ones in the gathered, SwiGLU and
// output rows, it shares their launches, and the combine reads its bf16 output rows.
bool shared_expert_folded(const GpuLayer& L);

// Makes the GEMM plans (ops/cuda/gemm.h) of layer L's routed-expert GEMM pair for every row class
// (ops/gemm_plan_rows.h) up to max_rows in c.gemm's plan cache (the rank's contexts share it), by
// running the pair once per class on zeroed scratch rows on c.stream, and waits for them: a batch
// then pays no cuBLASLt heuristic per expert (a warm-up batch reaches only the row counts its
// routing happens to give). Returns the classes made.
int64_t gpu_moe_plan_experts(const GpuCtx& c, const GpuWeights& W, const GpuLayer& L,
                             int64_t max_rows);

// The routing-free start of layer L's MoE on c.stream (compute), once y has arrived: fp4 experts
// re-encoded into fp8 tiles; then, after `routed` (the router's stream done), es.fork recorded
// (where the expert streams start) and the shared expert (this rank's slice) over all rows into
// s.acc (fp32), unless it runs as expert E of the grouped fp8 kernel (shared_expert_folded). The
// runner calls it before the host waits for the router's counts, so the shared expert hides that
// wait and the launches after it (docs/performance-notes.md, sessions 47–48). gpu_moe_experts
// follows it.
void gpu_moe_begin(const GpuCtx& c, const GpuExpertStreams& es, const GpuWeights& W,
                   const GpuLayer& L, const bf16* y, int64_t rows, cudaEvent_t routed,
                   GpuMoeScratch& s);

// After gpu_moe_begin, once r is complete and its counts are on the host: the gather by expert,
// the routed experts (a grouped kernel on c.stream, or GEMMs per expert spread over `es` from
// es.fork, joined back before the combine), the weighted sum with the shared expert's → out bf16
// [rows, d_model] on c.stream.
void gpu_moe_experts(const GpuCtx& c, const GpuExpertStreams& es, const GpuWeights& W,
                     const GpuLayer& L, const bf16* y, int64_t rows, const GpuRouteScratch& r,
                     GpuMoeScratch& s, bf16* out);

}  // namespace cpfill::cuda
