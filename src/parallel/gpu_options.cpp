// The names of GpuCollectives (parallel/gpu_prefill.h), for the CLI and reports.
#include "core/error.h"
#include "parallel/gpu_prefill.h"

namespace cpfill {

GpuCollectives parse_gpu_collectives(const std::string& s) {
    if (s == "nccl") return GpuCollectives::Nccl;
    if (s == "ce") return GpuCollectives::Ce;
    CPFILL_FAIL("--collectives {}: expected nccl (NCCL) or ce (the GPUs' copy engines)", s);
}

const char* gpu_collectives_name(GpuCollectives c) {
    return c == GpuCollectives::Ce ? "ce" : "nccl";
}

}  // namespace cpfill
