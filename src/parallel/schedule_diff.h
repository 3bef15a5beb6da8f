// Why two prefills of the same requests under different schedules (CP size, TBO, chunks) part.
// A schedule changes the order of a few fp32 sums, so outputs differ by rounding (~1e-6) — until a
// top-k choice (indexer in CSA layers, router in learned-routing layers) is a near-tie that the two
// orders resolve differently. From that position on the runs legitimately differ by O(1e-2): the
// position's own output changes, and through its window key and compressed entries so do later
// positions' (docs/numerics.md). find_parting finds the first position whose logits part, and the
// choice at that position that differs between the runs, with its margin recomputed in fp32. A
// parting without such a near-tie is a schedule bug.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model/weights.h"
#include "parallel/cp_prefill.h"

namespace cpfill {

// One top-k choice of one row: the chosen indices (ascending) and the margin between the k-th
// and the (k+1)-th key, relative to the largest |key| (∞ when the top-k keeps every candidate).
struct TopkChoice {
    std::vector<int32_t> chosen;
    double margin = INFINITY;
};

// The choices of request `request`'s position `pos` in `layer`, recomputed in fp32 from `run`'s
// records: its residual streams before the layer (record_hidden) and its KV store. indexer: CSA
// layers (all eligible entries, margin ∞, while not sparse); router: learned-routing layers.
struct RowChoices {
    TopkChoice indexer, router;
};
RowChoices row_choices(const ModelWeights& w, const PrefillOutput& run, int request, int64_t pos,
                       int layer);

// Where run `b` first parts from run `a` (the same requests; both with all_logits, record_topk
// and record_hidden). Positions compare by max |b − a| over their logits relative to the largest
// |a| of the request's logits.
struct Parting {
    double diff = 0;    // over every position of every request
    int request = -1;   // the first request with a position over tol (−1: none)
    int64_t pos = -1;   // its first such position
    double before = 0;  // the largest difference of that request's positions before `pos`
    // The first layer whose top-k choice at `pos` differs between the runs (differs), or when
    // none is seen to, the layer whose choice there has the smallest margin (−1: no choice).
    int layer = -1;
    std::string choice;  // "indexer" or "router"
    bool differs = false;
    double margin = INFINITY;    // that choice's margin in run a
    double margin_b = INFINITY;  // and in run b
};
Parting find_parting(const ModelWeights& w, const PrefillOutput& a, const PrefillOutput& b,
                     double tol);

}  // namespace cpfill
