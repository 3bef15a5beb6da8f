// SplitCollectives: the slot table and the sync/async dispatch.
#include "parallel/collectives.h"

#include "core/error.h"
#include "parallel/exchange_plan.h"

namespace cpfill {

namespace {
bool is_scatter(Exchange e) { return collective_of(e) == Collective::ReduceScatter; }
}  // namespace

SplitCollectives::SplitCollectives(RankContext& ctx, bool async) : ctx_(ctx), async_(async) {}

SplitCollectives::Entry& SplitCollectives::entry(Exchange slot, int sub) {
    CPFILL_CHECK(sub == 0 || sub == 1, "sub-batch {} out of range", sub);
    return entries_[static_cast<size_t>(slot)][sub];
}

float* SplitCollectives::send(Exchange slot, int sub, int64_t count) {
    Entry& e = entry(slot, sub);
    CPFILL_CHECK(!e.in_flight, "{} of sub-batch {}: send buffer reused before finish()",
                 exchange_name(slot), sub);
    const int64_t in = is_scatter(slot) ? ctx_.cp_size * count : count;
    if (static_cast<int64_t>(e.send.size()) < in) e.send.resize(in);
    return e.send.data();
}

void SplitCollectives::launch(Exchange slot, int sub, int64_t count) {
    Entry& e = entry(slot, sub);
    CPFILL_CHECK(!e.in_flight, "{} of sub-batch {} launched twice", exchange_name(slot), sub);
    const int64_t out = is_scatter(slot) ? count : ctx_.cp_size * count;
    if (static_cast<int64_t>(e.recv.size()) < out) e.recv.resize(out);
    e.count = count;
    e.in_flight = true;
    Communicator* comm = async_ ? ctx_.overlap : ctx_.cp;
    Stream& stream = async_ ? *ctx_.comm : *ctx_.compute;
    if (is_scatter(slot))
        comm->reduce_scatter(e.send.data(), e.recv.data(), count, stream);
    else
        comm->all_gather(e.send.data(), e.recv.data(), count, stream);
    stream.record(e.done);
}

const float* SplitCollectives::finish(Exchange slot, int sub) {
    Entry& e = entry(slot, sub);
    CPFILL_CHECK(e.in_flight, "{} of sub-batch {} finished without a launch", exchange_name(slot),
                 sub);
    e.done.wait(ctx_.deadline, std::string(exchange_name(slot)) + " of sub-batch " +
                                   std::to_string(sub) + " on rank " + std::to_string(ctx_.rank));
    e.in_flight = false;
    return e.recv.data();
}

}  // namespace cpfill
