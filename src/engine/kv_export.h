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
#include <vector>

#include "io/model_config.h"
#include "model/kv_store.h"

namespace cpfill {

// The manifest DIR/manifest.json names the files of the last run that wrote DIR:
//   {"format": "cpfill-kv-manifest-1", "complete": true, "files": ["request_0.safetensors", …],
//    "n_tokens": [9, …]}
// ("complete": false while a run is writing; it then names the old and the new files).
inline constexpr const char* kKvManifest = "manifest.json";

// request_<r>.safetensors for r < n_requests.
std::vector<std::string> kv_state_files(size_t n_requests);
// The files DIR's manifest names (empty when DIR or the manifest is absent). Throws when DIR is
// not a folder, the manifest is not a cpfill one, or DIR holds a file that looks like ours
// (request_*.safetensors) that the manifest does not name: a folder of a run whose manifest was
// lost, or someone else's — neither is overwritten nor deleted.
std::vector<std::string> check_kv_out_dir(const std::string& dir);
// Data bytes of one request's file (the tensors, without the JSON header) after n_tokens tokens.
size_t kv_state_bytes(const ModelConfig& cfg, int64_t n_tokens);

// Writes DIR/request_<r>.safetensors for every request of the store (creates DIR) and the
// manifest, and removes the files an earlier run's manifest named that this run did not write.
// Each file is written to a temporary file and renamed into place (io/atomic_file.h).
void write_kv_state(const std::string& dir, const KvStore& store, const ModelConfig& cfg);

}  // namespace cpfill
