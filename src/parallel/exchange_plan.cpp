// The collective and width of each block exchange (exchange_plan.h).
#include "parallel/exchange_plan.h"

#include "core/error.h"
#include "model/kv_store.h"

namespace cpfill {

Collective collective_of(Exchange e) {
    return e == Exchange::MoeSums ? Collective::ReduceScatter : Collective::AllGather;
}

const char* exchange_name(Exchange e) {
    switch (e) {
        case Exchange::AttnInputs:
            return "attention-input all_gather";
        case Exchange::MoeInputs:
            return "MoE-input all_gather";
        case Exchange::MoeSums:
            return "MoE-output reduce_scatter";
        default:
            return "exchange";
    }
}

int64_t exchange_width(const ModelConfig& cfg, AttnType type, Exchange e) {
    switch (e) {
        case Exchange::AttnInputs:
            return packed_widths(cfg, type).total();
        case Exchange::MoeInputs:
        case Exchange::MoeSums:
            return cfg.d_model;
        default:
            CPFILL_FAIL("exchange {} has no width", static_cast<int>(e));
    }
}

}  // namespace cpfill
