// Log-probabilities from one row of logits (f32 [vocab]): log-softmax computed in double, the
// probability of one token and the k most likely tokens. Used by both endpoints' responses.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace cpfill::serve {

// log Σ exp(logits[i]) over the row, stable (max subtracted first).
double log_sum_exp(const float* logits, int64_t vocab);

// The k most likely ids with their log-probabilities (logit − lse), most likely first; equal
// logits keep the lower id first. k is clamped to the vocabulary.
std::vector<std::pair<int32_t, double>> top_logprobs(const float* logits, int64_t vocab, int k,
                                                     double lse);

}  // namespace cpfill::serve
