// Split-phase collectives for the CP forward on CPU ranks (docs/design.md §5): launch(e, sub)
// issues the collective of a block exchange (parallel/exchange_plan.h) from its persistent send
// buffer; finish(e, sub) waits for it and returns the receive buffer. Buffers and events are
// persistent per (exchange, sub-batch): nothing is allocated per layer once they have grown to the
// largest layer's size, and an exchange's send buffer stays untouched until it has been finished.
//   sync  (TBO off): the CP communicator on the compute stream — the collective runs in launch();
//   async (TBO on):  the overlap communicator (a dup) on the comm stream — launch() returns at
//                    once, finish() waits on the slot's event with the deadline.
#pragma once

#include <array>
#include <chrono>
#include <string>
#include <vector>

#include "model/decoder_block.h"
#include "runtime/communicator.h"
#include "runtime/stream.h"

namespace cpfill {

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
    // The send buffer of (e, sub), grown to hold `count` floats per rank of input
    // (reduce-scatter: cp_size · count).
    float* send(Exchange e, int sub, int64_t count);
    void launch(Exchange e, int sub, int64_t count);
    const float* finish(Exchange e, int sub);

  private:
    struct Entry {
        std::vector<float> send, recv;
        Event done;
        bool in_flight = false;
        int64_t count = 0;
    };
    Entry& entry(Exchange e, int sub);

    RankContext& ctx_;
    bool async_;
    std::array<std::array<Entry, 2>, static_cast<size_t>(Exchange::kCount)> entries_;
};

}  // namespace cpfill
