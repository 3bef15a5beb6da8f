// Communicator: the one virtual interface for collectives (docs/design.md §6). Every collective
// runs on an explicit Stream, in program order; all ranks of a communicator must issue the same
// collectives in the same order. Buffers are fp32; counts are elements per rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/stream.h"

namespace cpfill {

enum class CollKind { AllGather, ReduceScatter, AllReduce, Barrier };
std::string_view coll_kind_name(CollKind k);

class Communicator {
  public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    // recv[size · count] ← the ranks' send[count] one after another (rank-major).
    virtual void all_gather(const float* send, float* recv, int64_t count, Stream& stream) = 0;
    // recv[count] ← Σ over ranks of their send[rank · count … (rank + 1) · count).
    virtual void reduce_scatter(const float* send, float* recv, int64_t count, Stream& stream) = 0;
    // recv[count] ← Σ over ranks of send[count] (recv may alias send).
    virtual void all_reduce(const float* send, float* recv, int64_t count, Stream& stream) = 0;
    virtual void barrier(Stream& stream) = 0;
    // A communicator over the same ranks with its own ordering (a collective call: every rank
    // calls it, in the same order relative to other dup() calls).
    virtual std::unique_ptr<Communicator> dup() = 0;
    // Makes every pending and future collective of the group fail with `why` (a rank that failed
    // calls this so that its peers stop instead of hanging).
    virtual void abort(const std::string& why) = 0;
};

struct LocalCommOptions {
    std::chrono::milliseconds deadline{30000};  // longest wait for a peer before an error
    bool check = true;                          // compare (sequence, kind, count) across ranks
    int max_delay_us = 0;  // > 0: delay each collective randomly by up to this (tests)
    uint64_t delay_seed = 1;
};

// C communicators for C ranks that are threads of this process, one per rank.
std::vector<std::unique_ptr<Communicator>> make_local_communicators(int size,
                                                                    const LocalCommOptions& opt);

}  // namespace cpfill
