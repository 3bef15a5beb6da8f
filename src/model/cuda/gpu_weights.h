// DeepSeek-V4 weights of one CP rank on its GPU (CUDA backend, docs/design.md §3): every matrix
// bf16 — or, with GpuWeightFormat::Fp8, the release's fp8 linears and fp4 experts as e4m3 with fp32
// block scales (model/weight_bytes.h gpu_storage, docs/fp8.md) —, norms, mHC parameters, position
// biases, sinks and router biases fp32, tid2eid int64.
// Experts hold the rank's 1/C slice of their hidden width (slice units [I·p/C, I·(p+1)/C)), all
// experts of a layer in one buffer. Built either from host fp32 weights (upload) or generated on
// the device (benchmarks at real dimensions, nothing to read).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "model/cuda/stored_reader.h"
#include "model/weight_bytes.h"
#include "model/weights.h"
#include "runtime/cuda/buffer.h"

namespace cpfill::cuda {

// A GEMM weight [rows, cols] (the routed experts: n_experts of them, one after the other) in bf16,
// e4m3 with its fp32 block scales (ops/fp8_blocks.h layouts, one block of scales per matrix), or
// (routed experts) packed fp4 with E8M0 bytes (ops/cuda/fp4.h).
struct GpuMatrix {
    DeviceBuffer data, scale;
    GpuStorage storage = GpuStorage::Bf16;
    int64_t rows = 0, cols = 0;  // of one matrix
    bool fp8() const { return is_fp8(storage); }
    bool fp4() const { return storage == GpuStorage::Fp4; }
    ops::Fp8Blocks blocks() const { return fp8_blocks(storage); }
    // fp8: fp32 scales per matrix; fp4: E8M0 bytes per matrix.
    int64_t scales_per_matrix() const {
        return fp4() ? rows * cols / 32 : ops::fp8_scale_count(rows, cols, blocks());
    }
    // The bf16 values (refuses an fp8 matrix: its caller has no fp8 path).
    const __nv_bfloat16* bf16() const {
        CPFILL_CHECK(storage == GpuStorage::Bf16, "a {}×{} weight is fp8 where bf16 was expected",
                     rows, cols);
        return data.as<__nv_bfloat16>();
    }
};

struct GpuCompressor {
    DeviceBuffer wkv, wgate;  // bf16 [w · dim, d_model] (w = 2 with the CSA overlap)
    DeviceBuffer ape;         // f32 [ratio, w · dim]
    DeviceBuffer norm;        // f32 [dim]
};

struct GpuMhc {
    DeviceBuffer fn, base, scale;  // f32 [(2 + hc) · hc, hc · d_model], [(2 + hc) · hc], [3]
};

struct GpuLayer {
    AttnType type = AttnType::Sliding;
    MlpType mlp = MlpType::Learned;
    GpuMhc hc_attn, hc_ffn;
    DeviceBuffer attn_norm, ffn_norm;       // f32 [d_model]
    GpuMatrix wq_a, wq_b, wkv, wo_a, wo_b;  // shapes as AttentionWeights
    DeviceBuffer q_norm, kv_norm, sink;     // f32 [q_rank], [head_dim], [n_heads]
    GpuCompressor comp, idx_comp;           // CSA / HCA; idx_comp CSA only
    GpuMatrix idx_wq_b;                     // CSA only
    DeviceBuffer idx_weights_proj;          // bf16, CSA only
    DeviceBuffer gate;                      // bf16 [n_experts, d_model]
    DeviceBuffer gate_bias;                 // f32 [n_experts] (learned routing)
    DeviceBuffer tid2eid;                   // i64 [vocab, top_k] (hash routing)
    GpuMatrix w13;                          // [n_experts][2 · width, d_model]
    GpuMatrix w2;                           // [n_experts][d_model, width]
    GpuMatrix shared_w13, shared_w2;        // [2 · width, d_model], [d_model, width]
};

struct GpuWeights {
    ModelConfig cfg;
    ExpertSlice slice;
    int64_t width = 0;                                     // expert hidden units on this rank
    DeviceBuffer embed, head;                              // bf16 [vocab, d_model]
    DeviceBuffer norm;                                     // f32 [d_model]
    DeviceBuffer hc_head_fn, hc_head_base, hc_head_scale;  // f32 [hc, hc·d_model], [hc], [1]
    DeviceBuffer inv_freq_main, inv_freq_compress;         // f32 [rope_dim / 2]
    std::vector<GpuLayer> layers;
    GpuWeightFormat format = GpuWeightFormat::Bf16;
    size_t bytes = 0;  // device bytes held
    // fp8 re-encoding: values whose e4m3 · scale differs from the weight (docs/fp8.md: 0 for fp8
    // weights as shipped; fp4 experts whose 1×32 scales span more than 2^6 in a 128-block lose
    // their smallest values), of how many quantised. Counted as they are made.
    uint64_t fp8_inexact = 0, fp8_values = 0;
    bool dense_fp8() const;    // some attention / shared-expert matrix is fp8
    bool experts_fp8() const;  // the routed experts are fp8, or fp4 (re-encoded to fp8 per layer)
    bool experts_fp4() const;  // the routed experts are fp4
    // The lightning indexer scores in fp8 (ops::cuda::IndexerPrecision::Fp8): set when the weights
    // are made, as gpu_indexer_fp8(GpuIndexer::Auto, format, …) says; GpuGroup applies --indexer.
    bool indexer_fp8 = false;
};

// Uploads a rank's host weights (as load_rank_weights / slice_experts make them) to the current
// device: upload_top, then upload_layer for every layer. Checks tid2eid values against n_experts.
// fp8 matrices are quantised on the device (quantize_weight_fp8, power-of-two block scales).
GpuWeights upload_weights(const ModelWeights& host, GpuWeightFormat format = GpuWeightFormat::Bf16);
// The same in parts, so that the host needs to hold one layer at a time: the top-level tensors
// (embed, head, norm, hc_head; `host.layers` may be empty) with `layers` sized but empty, then
// layer `li` from its host weights. `bytes` counts what has been uploaded so far.
GpuWeights upload_top(const ModelWeights& host, GpuWeightFormat format = GpuWeightFormat::Bf16);
void upload_layer(GpuWeights& g, int li, const LayerWeights& host);

// The same from the checkpoint's stored bytes (docs/loading.md, "GPU upload from stored bytes"):
// read through `rd` (planned by stored_upload_plan), copied to the device as stored and decoded
// there; the result equals upload_top / upload_layer of the host f32 weights bit for bit, with
// the same errors for bad values. No host f32.
GpuWeights upload_stored_top(const Checkpoint& ck, ExpertSlice slice, GpuWeightFormat format,
                             StoredReader& rd);
void upload_stored_layer(GpuWeights& g, int li, const Checkpoint& ck, StoredReader& rd);
// The reads the stored upload of the ranks with expert slices `slices` (those of one process)
// makes, in its order, in pieces of at most `piece_bytes` (more for a weight whose single row, or
// fp8 128 rows, is larger): w1 / w3 only the slices' rows, everything else whole.
StoredPlan stored_upload_plan(const Checkpoint& ck, const std::vector<ExpertSlice>& slices,
                              size_t piece_bytes);

// Every device buffer of `g` named by its weight ("… (data)" / "… (scale)" for matrices), in the
// weight table's order (tests compare uploads with it).
std::vector<std::pair<std::string, const DeviceBuffer*>> device_buffers(const GpuWeights& g);

// Random weights of the shapes of `slice` of `cfg`, generated on the current device: normal-like
// (uniform with the same mean and deviation) per tensor family as io/random_checkpoint.h scales
// them, tid2eid rows of distinct experts. The same seed gives the same weights on every rank.
GpuWeights random_weights(const ModelConfig& cfg, ExpertSlice slice, uint64_t seed,
                          GpuWeightFormat format = GpuWeightFormat::Bf16);

using cpfill::slice_width;  // model/weights.h

}  // namespace cpfill::cuda
