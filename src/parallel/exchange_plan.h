// How context parallelism carries out a decoder block's exchanges (model/decoder_block.h), for
// both backends: which collective each is and how many values per local row it moves. The
// backends size their buffers and launch their collectives from this; the CUDA backend's TBO cost
// model counts its bytes (cp_prefill.h gpu_tbo_gain_seconds).
#pragma once

#include <cstddef>
#include <cstdint>

#include "io/model_config.h"
#include "model/decoder_block.h"

namespace cpfill {

enum class Collective { AllGather, ReduceScatter };

// Per-exchange tables (buffers, events) are indexed so.
constexpr size_t kExchanges = static_cast<size_t>(Exchange::kCount);
constexpr size_t slot(Exchange e) { return static_cast<size_t>(e); }

// AttnInputs and MoeInputs: all-gathers; MoeSums: a reduce-scatter.
Collective collective_of(Exchange e);

// For messages: "attention-input all_gather", …
const char* exchange_name(Exchange e);

// Values per local row: sent by an all-gather (each rank receives cp_size times as many), received
// by a reduce-scatter (each rank sends cp_size times as many). AttnInputs: the packed widths of
// the layer's type (kv_store.h packed_widths); MoeInputs, MoeSums: d_model.
int64_t exchange_width(const ModelConfig& cfg, AttnType type, Exchange e);

}  // namespace cpfill
