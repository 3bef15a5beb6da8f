// NcclComm: one rank's NCCL communicator for the CUDA backend (docs/design.md §6). Collectives run
// on an explicit CUDA stream over device buffers of a given dtype; all ranks issue the same
// collectives in the same order. dup() gives the comm stream its own communicator
// (ncclCommSplit), so each communicator is driven from exactly one stream. abort() kills pending
// collectives (ncclCommAbort) so that peers of a failed rank stop instead of hanging.
//
// Not a cpfill::Communicator: that interface moves fp32 host buffers on CPU Streams; this one moves
// bf16/fp32 device buffers on cudaStream_t. The plan of collectives above both is the same.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "core/error.h"

#define CPFILL_NCCL_CHECK(expr)                                                               \
    do {                                                                                      \
        ncclResult_t cpfill_nr_ = (expr);                                                     \
        if (cpfill_nr_ != ncclSuccess)                                                        \
            CPFILL_FAIL("{} failed: {} ({})", #expr, ncclGetErrorString(cpfill_nr_),          \
                        ncclGetLastError(nullptr) ? ncclGetLastError(nullptr) : "no detail"); \
    } while (0)

namespace cpfill::cuda {

class NcclComm {
  public:
    // Collective over the `size` ranks that share `id`; the caller's current device is used.
    NcclComm(int rank, int size, const ncclUniqueId& id);
    ~NcclComm();
    NcclComm(const NcclComm&) = delete;
    NcclComm& operator=(const NcclComm&) = delete;

    int rank() const { return rank_; }
    int size() const { return size_; }
    // A communicator over the same ranks (collective: every rank calls it, in the same order).
    std::unique_ptr<NcclComm> dup();

    // recv[size · count] ← every rank's send[count], rank-major.
    void all_gather(const void* send, void* recv, int64_t count, ncclDataType_t type,
                    cudaStream_t stream);
    // recv[count] ← Σ over ranks of send[rank · count … (rank + 1) · count).
    void reduce_scatter(const void* send, void* recv, int64_t count, ncclDataType_t type,
                        cudaStream_t stream);
    // recv[count] ← Σ over ranks of send[count].
    void all_reduce(const void* send, void* recv, int64_t count, ncclDataType_t type,
                    cudaStream_t stream);
    // Kills pending work; later calls throw. Safe to call more than once and from another thread
    // than the one driving the communicator (a watchdog unblocking a stuck rank); never throws.
    void abort() noexcept;

  private:
    explicit NcclComm(ncclComm_t comm, int rank, int size)
        : comm_(comm), rank_(rank), size_(size) {}
    ncclComm_t comm_ = nullptr;
    int rank_ = 0, size_ = 1;
    std::atomic<bool> aborted_{false};
};

}  // namespace cpfill::cuda
