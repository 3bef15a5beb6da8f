// CUDA error checks (docs/conventions.md): CPFILL_CUDA_CHECK(expr) and CPFILL_CUBLAS_CHECK(expr)
// throw cpfill::Error with the failing call, the error name and file:line. Only CUDA code includes
// this.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/error.h"

#define CPFILL_CUDA_CHECK(expr)                                                     \
    do {                                                                            \
        cudaError_t cpfill_err_ = (expr);                                           \
        if (cpfill_err_ != cudaSuccess)                                             \
            CPFILL_FAIL("{} failed: {} ({})", #expr, cudaGetErrorName(cpfill_err_), \
                        cudaGetErrorString(cpfill_err_));                           \
    } while (0)

#define CPFILL_CUBLAS_CHECK(expr)                                                            \
    do {                                                                                     \
        cublasStatus_t cpfill_st_ = (expr);                                                  \
        if (cpfill_st_ != CUBLAS_STATUS_SUCCESS)                                             \
            CPFILL_FAIL("{} failed: cuBLAS status {}", #expr, static_cast<int>(cpfill_st_)); \
    } while (0)
