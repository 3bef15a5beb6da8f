// CeComm: collectives of the ranks of one process through the GPUs' copy engines, a DeviceComm
// (runtime/cuda/device_comm.h; docs/parallel.md, "Collectives: NCCL or the copy engines"). A rank
// pulls what it receives from its peers' send buffers with peer copies queued on its own stream
// (cudaMemcpyPeerAsync with peer access: the copy engines move the bytes, no SM runs for them; GPUs
// without peer access between them are refused); the streams order
// themselves through 64-bit flags in pinned host memory that they write and wait on
// (cuStreamWriteValue64 / cuStreamWaitValue64), so no host thread waits inside a collective.
//
// Call n of a communicator, on rank r's stream:
//   1. ready[r] ← n: everything before on the stream has run (r's send buffer is written, its
//      receive buffer and staging are free);
//   2. for each peer p, from r + 1 round the ring: wait until ready[p] ≥ n, copy p's part (the
//      whole send buffer for a gather or an all-reduce, block r for a reduce-scatter) into recv
//      (gathers) or into r's staging (reductions);
//   3. done[r] ← n: r has read every peer's send buffer;
//   4. wait until done[p] ≥ n for every peer: they have read r's send buffer, which work after
//      the call may overwrite;
//   5. reductions: r's own part and the staged ones summed in rank order in fp32, rounded once to
//      bf16, into recv (one small kernel; an all-reduce sums after step 4, as recv may be send).
// A peer's buffer is found by its offset: use_buffers registers every rank's workspace (planned
// alike on every rank), and p's send buffer is p's base plus the offset of r's within r's.
// abort() moves every flag so far ahead that every wait ends (and keeps it there while queued
// flag writes may still land), and later calls throw.
#pragma once

#include <memory>
#include <vector>

#include "runtime/cuda/device_comm.h"

namespace cpfill::cuda {

struct CeGroup;  // the flags and the buffer table the local ranks' communicators share

// The shared state of a group of `size` ranks, all driven by this process.
std::shared_ptr<CeGroup> make_ce_group(int size);

class CeComm final : public DeviceComm {
  public:
    // Rank `rank` of `group`, on the calling thread's current device (which may be another
    // rank's too: tests run several ranks on one GPU). Throws when the GPU or its driver cannot
    // wait on 64-bit stream values.
    CeComm(std::shared_ptr<CeGroup> group, int rank);
    ~CeComm() override;
    CeComm(const CeComm&) = delete;
    CeComm& operator=(const CeComm&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    const char* name() const override { return "ce"; }
    std::unique_ptr<DeviceComm> dup() override;

    void all_gather(const void* send, void* recv, int64_t count, CommData type,
                    cudaStream_t stream) override;
    void reduce_scatter(const void* send, void* recv, int64_t count, CommData type,
                        cudaStream_t stream) override;
    void all_reduce(const void* send, void* recv, int64_t count, CommData type,
                    cudaStream_t stream) override;
    void use_buffers(void* base, size_t bytes, void* staging, size_t staging_bytes,
                     const AbortFlag& flag, std::chrono::milliseconds deadline) override;
    void abort() noexcept override;

  private:
    enum class Kind { Gather, ReduceScatter, AllReduce };
    void collective(Kind kind, const void* send, void* recv, int64_t count, CommData type,
                    cudaStream_t stream);
    const char* peer_address(int peer, const void* mine, size_t bytes) const;
    void signal(int which, int rank, uint64_t value, cudaStream_t stream);
    void await(int which, int rank, uint64_t value, cudaStream_t stream);

    std::shared_ptr<CeGroup> group_;
    int rank_ = 0, size_ = 1, device_ = 0;
    uint64_t calls_ = 0;        // collectives issued (every rank's n-th call is call n)
    int dups_ = 0;              // dup() calls so far
    std::vector<char*> bases_;  // every rank's registered workspace (use_buffers)
    std::vector<int> devices_;
    size_t bytes_ = 0;
    char* staging_ = nullptr;
    size_t staging_bytes_ = 0;
};

}  // namespace cpfill::cuda
