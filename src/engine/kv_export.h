// KV state export (docs/kv-state.md): what a decoder needs to continue each request after the
// prefill, one safetensors file per request, f32:
//   layers.L.window            [min(len, window − 1), head_dim]  last keys (K = V), oldest first
//   layers.L.entries           [n_entries, head_dim]             compressed entries (CSA / HCA)
//   layers.L.index_keys        [n_entries, index_head_dim]       indexer keys (CSA)
//   layers.L.compressor.buffer_kv / buffer_gate   [len − n_entries·ratio, width]  projections of
//                              the tokens after the last complete window (width 2·head_dim in CSA)
//   layers.L.compressor.overlap_kv / overlap_gate [ratio, head_dim]  CSA: the Ca half of the last
//                              complete window's tokens (the next entry pools it)
//   layers.L.indexer.buffer_* / overlap_*          the same for the indexer's compressor (CSA)
// Metadata: format, n_tokens, per-layer type and entry counts.
#pragma once

#include <string>

#include "io/model_config.h"
#include "model/kv_store.h"

namespace cpfill {

// Writes DIR/request_<r>.safetensors for every request of the store (creates DIR).
void write_kv_state(const std::string& dir, const KvStore& store, const ModelConfig& cfg);

}  // namespace cpfill
