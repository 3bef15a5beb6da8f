// Split-phase collectives for the CP forward (docs/design.md §5): launch(slot, sub) issues a
// collective from the slot's persistent send buffer; finish(slot, sub) waits for it and returns
// the receive buffer. Buffers and events are persistent per (slot, sub-batch): nothing is
// allocated per layer once they have grown to the largest layer's size, and a slot's send buffer
// stays untouched until its collective has been finished.
//   sync  (TBO off): the CP communicator on the compute stream — the collective runs in launch();
//   async (TBO on):  the overlap communicator (a dup) on the comm stream — launch() returns at
//                    once, finish() waits on the slot's event with the deadline.
#pragma once

#include <array>
#include <chrono>
#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/stream.h"

namespace cpfill {

enum class Slot { AttnGather, MoeGather, MoeScatter, Gather, kCount };

struct RankContext {
    int rank = 0;
    int cp_size = 1;
    Communicator* cp = nullptr;       // driven from the compute stream only
    Communicator* overlap = nullptr;  // driven from the comm stream only
    Stream* compute = nullptr;        // inline on the CPU backend: the rank thread
    Stream* comm = nullptr;           // a worker thread
    std::chrono::milliseconds deadline{30000};
};

class SplitCollectives {
  public:
    SplitCollectives(RankContext& ctx, bool async);
    // The send buffer of (slot, sub), grown to hold `count` floats per rank of input
    // (reduce-scatter: cp_size · count).
    float* send(Slot slot, int sub, int64_t count);
    void launch(Slot slot, int sub, int64_t count);
    const float* finish(Slot slot, int sub);

  private:
    struct Entry {
        std::vector<float> send, recv;
        Event done;
        bool in_flight = false;
        int64_t count = 0;
    };
    Entry& entry(Slot slot, int sub);

    RankContext& ctx_;
    bool async_;
    std::array<std::array<Entry, 2>, static_cast<size_t>(Slot::kCount)> entries_;
};

}  // namespace cpfill
