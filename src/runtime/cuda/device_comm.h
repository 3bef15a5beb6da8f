// DeviceComm: one rank's collectives over device buffers on a CUDA stream (docs/parallel.md,
// "Collectives: NCCL or the copy engines"). Two implementations: NcclComm (any layout of ranks,
// NCCL's kernels) and CeComm (the ranks of one process, the GPUs' copy engines: no SMs for the
// data movement). All ranks issue the same collectives in the same order; a call returns once its
// work is queued on `stream`, and the buffers follow NCCL's rules: `send` is read and `recv`
// written at the call's point in the stream's order.
//
// Not a cpfill::Communicator: that interface moves fp32 host buffers on CPU Streams; this one moves
// bf16 or raw bytes in device memory. The plan of collectives above both is the same.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace cpfill::cuda {

class AbortFlag;

// The values a collective moves: bf16 (summed by the reductions in fp32, rounded once) or bytes
// (gathers only).
enum class CommData { Bf16, Bytes };

inline size_t comm_data_bytes(CommData t) { return t == CommData::Bf16 ? 2 : 1; }

class DeviceComm {
  public:
    virtual ~DeviceComm() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual const char* name() const = 0;  // "nccl" or "ce"

    // A communicator over the same ranks, for another stream (collective: every rank calls it,
    // in the same order).
    virtual std::unique_ptr<DeviceComm> dup() = 0;

    // recv[size · count] ← every rank's send[count], rank-major.
    virtual void all_gather(const void* send, void* recv, int64_t count, CommData type,
                            cudaStream_t stream) = 0;
    // recv[count] ← Σ over ranks of send[rank · count … (rank + 1) · count) (bf16).
    virtual void reduce_scatter(const void* send, void* recv, int64_t count, CommData type,
                                cudaStream_t stream) = 0;
    // recv[count] ← Σ over ranks of send[count] (bf16; recv may be send).
    virtual void all_reduce(const void* send, void* recv, int64_t count, CommData type,
                            cudaStream_t stream) = 0;

    // Collective, on the host: the device buffers of the calls that follow lie in [base, base +
    // bytes), which every rank lays out alike (one workspace plan), and `staging` (device memory
    // of this rank, `staging_bytes`) may hold the peers' parts of a reduction. Returns after
    // every rank has called it; throws when `flag` is raised or after `deadline`. NCCL needs
    // neither (staging_bytes_for: 0).
    virtual void use_buffers(void* /*base*/, size_t /*bytes*/, void* /*staging*/,
                             size_t /*staging_bytes*/, const AbortFlag& /*flag*/,
                             std::chrono::milliseconds /*deadline*/) {}

    // Kills pending work; later calls throw. Safe to call more than once and from another thread
    // than the one driving the communicator (a watchdog unblocking a stuck rank); never throws.
    virtual void abort() noexcept = 0;
};

// The staging a rank needs for reductions of up to `max_count` values of `type` over `size` ranks
// under `collectives` ("ce": the peers' parts, size − 1 blocks; "nccl": none).
size_t comm_staging_bytes(bool copy_engines, int size, int64_t max_count, CommData type);

}  // namespace cpfill::cuda
