// gpu_kernel_choices (parallel/gpu_prefill.h): which of the interchangeable GPU kernels a prefill
// takes, as the ops decide it (ops/cuda/attention.h), for the bench's header; asked
// on the calling thread's current device (every GPU of a run is of one kind).
#include <fmt/format.h>

#include "ops/cuda/attention.h"
#include "parallel/gpu_prefill.h"

namespace cpfill {

std::string gpu_kernel_choices(const ModelConfig& cfg) {
    namespace oc = ops::cuda;
    return fmt::format("{} (attention)",
                       oc::attention_kernel_name(oc::attention_kernel_for(cfg.rope_dim)));
}

}  // namespace cpfill
