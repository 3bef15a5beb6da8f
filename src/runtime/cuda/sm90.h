// Whether a CUDA device runs the kernels built for sm_90a (wgmma, TMA: the grouped fp8 GEMM, the
// fp8 indexer): compute capability 9.0 exactly. False when the device cannot be queried.
#pragma once

namespace cpfill::cuda {

bool device_is_sm90(int device);
bool current_device_is_sm90();

}  // namespace cpfill::cuda
