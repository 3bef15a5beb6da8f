// TMA tensor maps (ops/cuda/tensor_map.h).
#include <mutex>

#include "core/error.h"
#include "ops/cuda/tensor_map.h"
#include "runtime/cuda/cuda_check.h"

namespace cpfill::ops::cuda {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    static std::once_flag once;
    std::call_once(once, [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q{};
        CPFILL_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                           cudaEnableDefault, &q));
        CPFILL_CHECK(q == cudaDriverEntryPointSuccess && p != nullptr,
                     "the CUDA driver has no cuTensorMapEncodeTiled (a driver for CUDA 12 or later "
                     "is needed)");
        fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    });
    return fn;
}

CUtensorMap e4m3_tile_map(const void* base, int64_t rows, int64_t cols, int box_rows,
                          const char* what) {
    CUtensorMap m{};
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols)};
    const cuuint32_t box[2] = {128, static_cast<cuuint32_t>(box_rows)}, elem[2] = {1, 1};
    const CUresult r = tensor_map_encoder()(
        &m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, elem,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    CPFILL_CHECK(r == CUDA_SUCCESS, "{}: tensor map of {} × {} bytes refused ({})", what, rows,
                 cols, static_cast<int>(r));
    return m;
}

CUtensorMap byte_tile_map_3d(const void* base, int64_t d0, int64_t d1, int64_t d2, int box1,
                             int box2, const char* what) {
    CUtensorMap m{};
    const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d0), static_cast<cuuint64_t>(d1),
                                static_cast<cuuint64_t>(d2)};
    const cuuint64_t strides[2] = {static_cast<cuuint64_t>(d0), static_cast<cuuint64_t>(d0 * d1)};
    const cuuint32_t box[3] = {128, static_cast<cuuint32_t>(box1), static_cast<cuuint32_t>(box2)};
    const cuuint32_t elem[3] = {1, 1, 1};
    const CUresult r = tensor_map_encoder()(
        &m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(base), dims, strides, box, elem,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    CPFILL_CHECK(r == CUDA_SUCCESS, "{}: tensor map of {} × {} × {} bytes refused ({})", what, d2,
                 d1, d0, static_cast<int>(r));
    return m;
}

}  // namespace cpfill::ops::cuda
