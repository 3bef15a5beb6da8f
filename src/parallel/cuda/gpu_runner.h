// One CP rank of the GPU prefill: the rank's persistent device state (streams, communicators,
// cuBLASLt context, weights, workspace arena) and one run of a plan, as the CUDA backend of the
// one engine (parallel/engine.h; the CPU ranks' backend is cp_prefill.cpp's): the block's ops on
// bf16 rows and the fp32 residual, the exchanges as collectives (NCCL or the copy engines;
// split-phase on the comm stream with two-batch overlap), the head.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "model/batch.h"
#include "model/cuda/gpu_context.h"
#include "model/cuda/gpu_moe.h"
#include "model/cuda/gpu_weights.h"
#include "parallel/gpu_prefill.h"
#include "parallel/run_plan.h"
#include "runtime/cuda/arena.h"
#include "runtime/cuda/device_comm.h"
#include "runtime/cuda/stream.h"

namespace cpfill::cuda {

// The streams and events of one rank, created on its thread with its device current.
struct RankStreams {
    CudaStream compute, comm;
    CudaStream route;  // MoE routing, so that the host's wait for the expert counts never stalls
                       // the compute stream
    CudaStream experts[kMaxExpertStreams];  // the routed experts' GEMMs (GpuExpertStreams)
    CudaEvent expert_fork, expert_join[kMaxExpertStreams];
};

// Whether experts go through cpfill's grouped expert kernel (ops/cuda/grouped_fp8.h) under `mode`
// on this GPU (layers whose weights it takes: cuda::experts_grouped_fp8, experts_grouped_bf16).
bool grouped_experts(ExpertGemm mode);

struct RankDevice {
    int rank = 0, cp = 1, device = 0;
    std::unique_ptr<RankStreams> streams;  // owns what the handles below name (destroyed last)
    cudaStream_t compute = nullptr, comm = nullptr, route = nullptr;
    // NCCL or the copy engines (GpuGroupOptions::collectives); driven from compute / comm only.
    std::unique_ptr<DeviceComm> cp_comm, overlap;
    bool copy_engines = false;  // cp_comm is a CeComm: the workspace holds its staging
    std::unique_ptr<ops::cuda::GemmContext> gemm, gemm_route;  // one per stream that runs GEMMs
    GpuExpertStreams experts;  // the routed experts' streams (init_streams)
    std::vector<std::unique_ptr<ops::cuda::GemmContext>> expert_gemms;
    std::unique_ptr<ops::cuda::GroupedGemm> grouped;  // the grouped expert GEMMs, when asked for
    // On the rank's thread, its device current, after `gemm` exists (the expert streams'
    // contexts share its plans).
    void init_streams();
    // Points `experts` at `streams` expert streams and (grouped) the grouped GEMMs, creating the
    // cuBLAS contexts a run asks for beyond those init_streams made (the default count).
    void use_experts(int streams, ExpertGemm mode, int n_experts);
    std::unique_ptr<GpuWeights> weights;
    std::unique_ptr<Arena> arena;    // kept between runs; regrown when a run needs more
    int32_t* host_counts = nullptr;  // pinned [2, n_experts]: per sub-batch
    void alloc_host_counts(int n_experts);
    ~RankDevice();
};

// Device bytes of the workspace a run of `plan` needs on one rank (the arena's size).
struct WeightNeeds;
// copy_engines: with the staging of copy-engine collectives (runtime/cuda/ce_comm.h).
size_t workspace_bytes(const ModelConfig& cfg, const RunPlan& plan, int cp, int64_t width,
                       const GpuRunOptions& opt, const WeightNeeds& needs,
                       bool copy_engines = false);

// Runs the plan on this rank (its device current). rank 0 fills `out` (may be null elsewhere);
// stats are rank 0's.
void run_rank(RankDevice& dev, const RunPlan& plan, const GpuRunOptions& opt, const AbortFlag& flag,
              std::chrono::milliseconds deadline, PrefillOutput* out, GpuStats* stats);

}  // namespace cpfill::cuda
