// A random DeepSeek-V4 checkpoint for a ModelConfig: config.json + safetensors (one file, or
// shards + model.safetensors.index.json), in any naming and storage format the loader accepts.
// Values are deterministic in (seed, tensor name) — independent of naming, dtype, sharding and
// thread count — and make a numerically sane network (unit-scale activations):
//   linears, gate, head ~ N(0, 1/fan_in); embed ~ N(0, 1); norm weights ~ 1 + 0.1·N;
//   hc fn ~ 0.5·N(0, 1/fan_in), hc base ~ 0.3·N, hc scale ~ 1 + 0.1·N; attn_sink ~ N(0, 1);
//   ape ~ 0.5·N; gate.bias ~ 0.05·N; tid2eid = top_k distinct random experts per token.
// Normals come from std::mt19937_64 and our own Box–Muller, so every standard library gives the
// same values.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/tensor.h"
#include "io/model_config.h"
#include "io/weight_specs.h"

namespace cpfill {

struct RandomCheckpointOptions {
    uint64_t seed = 0;
    // "hf": names as HF save_pretrained writes them + the HF config form; "upstream": official
    // names + the reference config form; "hf-module": HF module names (stacked experts) + HF form.
    std::string names = "hf";
    // "f32" | "bf16" (F32-class tensors stay F32) | "fp8" (the official layout: F8_E4M3 + E8M0
    // block scales for the fp8-class linears, BF16 / F32 / I64 where §6.4 lists them).
    std::string dtype = "f32";
    // "same": routed experts like the other linears; "fp4": packed fp4 with 1×32 E8M0 scales.
    std::string experts = "same";
    size_t max_shard_bytes = size_t{4} << 30;
    int threads = 0;  // 0: default_thread_count()
    // Called after each tensor is made with the stored bytes done and in all (for a progress
    // line); an exception from it stops the write like any other failure.
    std::function<void(size_t done, size_t total)> on_progress;
};

// Writes config.json and the weights into `dir` (created if needed). First plans every tensor and
// checks the sizes (no tensor too large to exist), the host memory a shard needs, the free disk
// space and the file size limit, and refuses before writing anything. Then writes into a staging
// folder (beside `dir`, or inside it when it exists) and moves the finished checkpoint into place:
// on any failure `dir` is as it was (absent, or holding the earlier checkpoint) and the staging
// folder is removed.
void write_random_checkpoint(const ModelConfig& cfg, const std::string& dir,
                             const RandomCheckpointOptions& opt);

// The fp32 values the checkpoint holds for `spec` before storage rounding (I64 for tid2eid).
Tensor random_weight(const ModelConfig& cfg, const WeightSpec& spec, uint64_t seed,
                     int threads = 1);

}  // namespace cpfill
