// NcclComm: one rank's NCCL communicator for the CUDA backend (docs/design.md §6), a DeviceComm
// (runtime/cuda/device_comm.h). dup() gives the comm stream its own communicator (ncclCommSplit),
// so each communicator is driven from exactly one stream. abort() kills pending collectives
// (ncclCommAbort) so that peers of a failed rank stop instead of hanging.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "core/error.h"
#include "runtime/cuda/device_comm.h"

#define CPFILL_NCCL_CHECK(expr)                                                               \
    do {                                                                                      \
        ncclResult_t cpfill_nr_ = (expr);                                                     \
        if (cpfill_nr_ != ncclSuccess)                                                        \
            CPFILL_FAIL("{} failed: {} ({})", #expr, ncclGetErrorString(cpfill_nr_),          \
                        ncclGetLastError(nullptr) ? ncclGetLastError(nullptr) : "no detail"); \
    } while (0)

namespace cpfill::cuda {

class NcclComm final : public DeviceComm {
  public:
    // Collective over the `size` ranks that share `id`; the caller's current device is used.
    NcclComm(int rank, int size, const ncclUniqueId& id);
    ~NcclComm() override;
    NcclComm(const NcclComm&) = delete;
    NcclComm& operator=(const NcclComm&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    const char* name() const override { return "nccl"; }
    std::unique_ptr<DeviceComm> dup() override;

    void all_gather(const void* send, void* recv, int64_t count, CommData type,
                    cudaStream_t stream) override;
    void reduce_scatter(const void* send, void* recv, int64_t count, CommData type,
                        cudaStream_t stream) override;
    void all_reduce(const void* send, void* recv, int64_t count, CommData type,
                    cudaStream_t stream) override;
    void abort() noexcept override;

  private:
    explicit NcclComm(ncclComm_t comm, int rank, int size)
        : comm_(comm), rank_(rank), size_(size) {}
    ncclComm_t comm_ = nullptr;
    int rank_ = 0, size_ = 1;
    std::atomic<bool> aborted_{false};
};

}  // namespace cpfill::cuda
