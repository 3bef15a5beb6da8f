// GpuGroup and friends in a build without the CUDA backend: every entry point says so.
#include "core/error.h"
#include "parallel/gpu_prefill.h"

#ifndef CPFILL_HAVE_CUDA
namespace cpfill {

namespace {
[[noreturn]] void no_cuda() {
    CPFILL_FAIL("--device cuda: this cpfill was built without the CUDA backend (no nvcc found)");
}
}  // namespace

struct GpuGroup::Impl {};

GpuGroup::GpuGroup(const GpuGroupOptions&) { no_cuda(); }
GpuGroup::~GpuGroup() = default;
NcclId GpuGroup::new_nccl_id() { no_cuda(); }
int GpuGroup::cp() const { no_cuda(); }
const std::vector<int>& GpuGroup::local_ranks() const { no_cuda(); }
void GpuGroup::load(const std::vector<const ModelWeights*>&) { no_cuda(); }
void GpuGroup::load_top(const std::vector<const ModelWeights*>&) { no_cuda(); }
void GpuGroup::load_layer(int, const std::vector<const ModelWeights*>&) { no_cuda(); }
GpuGroup::StoredLoad GpuGroup::load_stored(const Checkpoint&, int, bool) { no_cuda(); }
void GpuGroup::randomize(const ModelConfig&, uint64_t) { no_cuda(); }
int64_t GpuGroup::prepare_expert_plans(int64_t) { no_cuda(); }
GpuGroup::WeightStats GpuGroup::weight_stats() const { no_cuda(); }
PrefillOutput GpuGroup::run(const std::vector<std::vector<int32_t>>&, const GpuRunOptions&,
                            GpuStats*) {
    no_cuda();
}
GpuMemoryPlan plan_gpu_memory(const ModelConfig&, int64_t, int, int, bool, bool, GpuWeightFormat,
                              int64_t, GpuIndexer, ResidualDtype) {
    no_cuda();
}
GpuCeilings measure_gpu_ceilings() { no_cuda(); }
std::string gpu_kernel_choices(const ModelConfig&) { no_cuda(); }

}  // namespace cpfill
#endif
