// What each weight of the table (io/weight_specs.h) takes on one rank: its element count for a
// rank's expert slice, the dtype the CUDA backend holds it in, and the totals the memory checks,
// `inspect` and `bench` print. CPU code (no CUDA headers): the byte counts are known without a GPU,
// and they are the same sums the GPU upload makes (model/cuda/gpu_weights.cu walks the same table).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "io/weight_specs.h"
#include "model/weights.h"
#include "ops/fp8_blocks.h"

namespace cpfill {

// Elements of `spec` a rank with expert slice `slice` holds: the whole tensor when it is
// replicated, slice_width(moe_dim, slice) of its moe_dim hidden units when it is an expert's.
int64_t rank_numel(const WeightSpec& spec, const ModelConfig& cfg, ExpertSlice slice);

// How the GPU holds the matrices the release ships in fp8 / fp4 (`--weights`, docs/fp8.md): all in
// bf16; those in fp8 e4m3 with fp32 block scales; or (Fp4) the fp8 linears so and the routed
// experts in packed fp4 e2m1 with E8M0 1×32 scales, as the release ships them. The tensors the
// release ships as bf16 / f32 stay so either way.
enum class GpuWeightFormat : uint8_t { Bf16, Fp8, Fp4 };
// Parses "bf16" / "fp8" / "fp4" (the CLI's "auto" is resolved from the checkpoint before this).
GpuWeightFormat parse_gpu_weight_format(const std::string& s);
std::string_view gpu_weight_format_name(GpuWeightFormat f);

// How the GPUs score the lightning indexer (`--indexer`, docs/fp8.md "The fp8 indexer on GPUs"):
// Auto follows the weights (fp8 for fp8 and fp4 weights on a GPU that runs the kernel, bf16
// otherwise); Bf16 and Fp8 choose it whatever the weights (Fp8 needs compute capability 9.0).
enum class GpuIndexer : uint8_t { Auto, Bf16, Fp8 };
GpuIndexer parse_gpu_indexer(const std::string& s);  // "auto", "bf16" or "fp8"
std::string_view gpu_indexer_name(GpuIndexer i);
// Whether the indexer scores in fp8 under `choice` with weights of `format`, on a GPU that runs
// the fp8 kernel (`sm90`) or not. Throws for Fp8 where the GPU cannot.
bool gpu_indexer_fp8(GpuIndexer choice, GpuWeightFormat format, bool sm90);

// What one weight is on a GPU: f32, int64, bf16, or e4m3 with 128×128 tile scales (the dense
// linears) or (row, 128 columns) scales (the routed experts; the upload keeps a layer's experts in
// 128×128 tiles instead when those are exact, which needs fewer bytes: the byte counts here are
// the (row, 128) ones, an upper bound).
// Fp4: packed e2m1 [rows, cols / 2] + E8M0 [rows, cols / 32] (ops/cuda/fp4.h), re-encoded to
// Fp8Tile on the device before each layer's expert GEMMs.
enum class GpuStorage : uint8_t { F32, I64, Bf16, Fp8Tile, Fp8Row, Fp4 };
bool is_fp8(GpuStorage s);
ops::Fp8Blocks fp8_blocks(GpuStorage s);  // Fp8Tile or Fp8Row

// The storage of `spec` on the GPU of a rank with expert slice `slice` under `format`: f32 for the
// small tensors (norms, mHC, sinks, position biases, router bias), int64 for tid2eid, bf16 for the
// GEMM matrices (is_gemm_weight) — except, with Fp8, the release's fp8 linears (Fp8Tile) and fp4
// routed experts (Fp8Row) whose GEMM input width on the rank is a multiple of 128 (the scale
// blocks; for wo_a also o_rank, its per-group row blocks; for the experts, shared and routed, both
// d_model and the slice width, so that w1 / w3 / w2 agree). With Fp4 the routed experts under the
// same rule are Fp4 instead. Others stay bf16.
GpuStorage gpu_storage(const WeightSpec& spec, const ModelConfig& cfg, ExpertSlice slice,
                       GpuWeightFormat format);
// The dtype of `spec`'s values with bf16 matrices (GpuWeightFormat::Bf16).
DType gpu_dtype(const WeightSpec& spec);
// Device bytes of `spec` on that rank: values, and the fp32 block scales of fp8 storage.
size_t gpu_spec_bytes(const WeightSpec& spec, const ModelConfig& cfg, ExpertSlice slice,
                      GpuWeightFormat format);

// The slice of the rank of `cp` that holds the most expert units (the memory checks size for it).
ExpertSlice widest_slice(int64_t moe_dim, int cp);

// Device bytes of rank `slice`'s weights: every weight of the table at gpu_dtype, plus the two
// RoPE frequency tables (f32 [rope_dim / 2] each).
size_t gpu_rank_weight_bytes(const ModelConfig& cfg, ExpertSlice slice,
                             GpuWeightFormat format = GpuWeightFormat::Bf16);
// What each GPU of a CP group of `cp` must hold: the widest rank's weight bytes. Refuses a cp
// outside [1, moe_dim], naming the range.
size_t gpu_weight_bytes(const ModelConfig& cfg, int cp,
                        GpuWeightFormat format = GpuWeightFormat::Bf16);

}  // namespace cpfill
