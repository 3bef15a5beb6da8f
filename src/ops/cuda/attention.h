// Shared-KV attention on the GPU (docs/architecture.md §3.4 steps 4–7, the semantics of
// ops/attention.h): each query attends to its window keys and a list of compressed entries with
// one fp32 softmax (docs/design.md §3) whose denominator also holds the per-head sink. K = V. bf16
// in, bf16 out.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cpfill::ops::cuda {

// Queries of one request against that request's KV store. Query i at position p = pos[i] uses:
//   window keys  positions j ∈ [max(0, p − window_size + 1), p] (row j − window0 of window);
//   entries      entry_idx == nullptr: entries[0 … min((p + 1) / ratio, n_entries) − 1] (HCA, all
//                eligible); otherwise the rows entry_idx[i, 0 … idx_stride) (CSA top-k), which
//                must be eligible and have their −1 padding at the end; ratio 0 or
//                n_entries 0: none (sliding layer).
struct AttnArgs {
    // [n_q, n_heads, head_dim]: normalised per head with RoPE applied, unless q_norm / rope_dim
    // ask the kernel to do that
    const __nv_bfloat16* q = nullptr;
    const int64_t* pos = nullptr;  // device [n_q], positions inside the request
    int64_t n_q = 0;
    int n_heads = 0;
    int head_dim = 512;  // only 512 (every DeepSeek-V4 model)
    // The window keys: row r is position window0 + r (a buffer of the last keys, as the KV store
    // keeps them in chunked prefill); every query's window positions must be ≥ window0.
    const __nv_bfloat16* window = nullptr;  // [≥ max(pos) + 1 − window0, head_dim]
    int64_t window0 = 0;
    int window_size = 128;
    const __nv_bfloat16* entries = nullptr;  // [n_entries, head_dim] compressed entries
    int64_t n_entries = 0;
    int ratio = 0;
    const int32_t* entry_idx = nullptr;  // [n_q, idx_stride] or nullptr
    int64_t idx_stride = 0;
    const float* sinks = nullptr;  // fp32 [n_heads]
    float scale = 0.0f;            // 1 / sqrt(head_dim)
    __nv_bfloat16* out = nullptr;  // [n_q, n_heads, head_dim]
    // The caller's passes over q and out folded into the kernel (default off), fp32 with one
    // rounding: q ← q / sqrt(mean(q²) + q_norm_eps) per head (no weight), then RoPE on the last
    // rope_dim channels of each q head and the inverse RoPE on those of each out head, as
    // ops/cuda/rope.h does them at position pos[i].
    bool q_norm = false;
    float q_norm_eps = 0.0f;
    int rope_dim = 0;                 // 0: no RoPE; else even, ≤ head_dim
    const float* inv_freq = nullptr;  // device fp32 [rope_dim / 2]
};

// On tensor cores (mma.sync bf16 → fp32; attention_tc.cu): one block per (query, group of up to 64
// heads), logits and the softmax in fp32, P rounded to bf16 for P·V. Any n_heads (groups of 16, 32
// or 64, padded); q, window, entries and out 16-byte aligned; Hopper (207 KiB of shared memory per
// block).
void attention_tc(const AttnArgs& a, cudaStream_t stream);

// On Hopper's warpgroup MMAs (wgmma bf16 → fp32; attention_wg.cu): one block of three warpgroups
// (two computing, one copying) per (query, group of 64 heads; fewer heads are padded), the same
// numerics as attention_tc (fp32 logits and softmax, P rounded to bf16). Same alignment needs;
// sm_90a only (a clear error elsewhere: attention_wg_supported says whether the current GPU runs
// it).
// persistent: one block per multiprocessor, each taking every n-th item (the next item's copies
// overlap the current one's end); otherwise one block per item. rope_dim at most 64.
void attention_wg(const AttnArgs& a, cudaStream_t stream, bool persistent = true);
inline constexpr int kWgMaxRopeDim = 64;
bool attention_wg_supported();

// The kernel the model runs. Auto (the default): attention_wg where it runs (a Hopper GPU, rope_dim
// at most 64), attention_tc elsewhere; the environment variable CPFILL_ATTENTION=tc|wg names one
// (wg where it cannot run is attention_wg's error; any other value is an error naming these).
enum class AttnKernel { Auto, Tc, Wg };
AttnKernel attention_kernel();
// The value of CPFILL_ATTENTION (null: unset) as a kernel; an unknown name is an error.
AttnKernel parse_attention_kernel(const char* env);
void attention(const AttnArgs& a, cudaStream_t stream);
// The kernel attention() runs on the current GPU for queries with this rope_dim (Tc or Wg), and its
// name ("attention_tc", "attention_wg"), for reports.
AttnKernel attention_kernel_for(int rope_dim);
const char* attention_kernel_name(AttnKernel k);

// The argument checks both kernels make (head_dim 512, counts, alignment, RoPE frequencies); the
// error names `kernel`.
void check_attention_args(const AttnArgs& a, const char* kernel);

// FLOPs the kernel spends (2 per multiply-add, logits and P·V) for queries at these host-side
// positions, for rate reports.
double attention_flops(const AttnArgs& a, const int64_t* host_pos, const int32_t* host_idx);

}  // namespace cpfill::ops::cuda
