// A stand-in for PrefillEngine::run behind the scheduler: records every batch it is given and
// answers each prompt with one-hot logits at (sum of its ids) mod vocab, so that a test can tell
// which answer went to which request; a prompt holding kFailToken makes the batch throw.
#pragma once

#include <mutex>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "serve/scheduler.h"

namespace cpfill::serve::test {

inline constexpr int32_t kFailToken = 66;
inline constexpr int64_t kFakeVocab = 64;

struct FakeRunner {
    struct Call {
        std::vector<std::vector<int32_t>> prompts;
        RunOptions options;
    };
    std::mutex mu;
    std::vector<Call> calls;

    static int32_t expected_token(const std::vector<int32_t>& p) {
        return static_cast<int32_t>(std::accumulate(p.begin(), p.end(), int64_t{0}) % kFakeVocab);
    }

    BatchRunner runner() {
        return [this](const std::vector<std::vector<int32_t>>& prompts, const RunOptions& o) {
            {
                std::lock_guard lock(mu);
                calls.push_back({prompts, o});
            }
            RunResult r;
            for (const auto& p : prompts) {
                for (int32_t id : p)
                    if (id == kFailToken) throw std::runtime_error("injected failure");
                Tensor l = Tensor::zeros(DType::F32, {kFakeVocab});
                l.f32()[expected_token(p)] = 1;
                r.out.logits.push_back(l);
                r.first_tokens.push_back(expected_token(p));
                LayerKv kv;
                kv.n_tokens = static_cast<int64_t>(p.size());
                r.out.kv.push_back({kv});
                r.n_tokens += kv.n_tokens;
            }
            r.prefill_seconds = 0.001;
            return r;
        };
    }
    std::vector<Call> snapshot() {
        std::lock_guard lock(mu);
        return calls;
    }
};

}  // namespace cpfill::serve::test
