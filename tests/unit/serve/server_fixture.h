// A real server on 127.0.0.1 (an ephemeral port) over the tiny model, and a second engine on the
// same checkpoint for the expected values: what the server answers is compared with what
// PrefillEngine::run gives for each prompt alone. Every client call has a read timeout and every
// wait is bounded, so a broken server fails the test instead of hanging CI.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <thread>

#include "../io/io_test_util.h"
#include "engine/prefill_engine.h"
#include "io/presets.h"
#include "io/random_checkpoint.h"
#include "serve/server.h"

namespace cpfill::serve::test {

// Polls `pred` for up to 30 s.
template <typename Pred>
bool eventually(Pred pred) {
    for (int i = 0; i < 30000; ++i) {
        if (pred()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return pred();
}

// The tiny model (vocab 512), written once for the test binary.
struct TinyModel {
    cpfill::test::TempDir dir;
    ModelConfig cfg = preset_config("tiny");
    std::unique_ptr<PrefillEngine> served, reference;
    TinyModel() {
        RandomCheckpointOptions o;
        o.seed = 11;
        write_random_checkpoint(cfg, dir.path().string(), o);
        EngineOptions eo;
        eo.threads = 2;
        served = std::make_unique<PrefillEngine>(dir.path().string(), eo);
        reference = std::make_unique<PrefillEngine>(dir.path().string(), eo);
    }
    static TinyModel& get() {
        static TinyModel m;
        return m;
    }
    std::string path() const { return dir.path().string(); }
};

struct ServerSetup {
    int64_t max_batch_tokens = 8192;
    size_t max_queue = 16;
    int64_t max_prompt_tokens = 0;
    bool hold_batches = false;
    bool ready = true;
    // Wraps the engine's run (e.g. to fail or count); empty: the engine as it is.
    std::function<RunResult(const std::vector<std::vector<int32_t>>&, const RunOptions&,
                            const BatchRunner&)>
        wrap;
};

class TestServer {
  public:
    explicit TestServer(const ServerSetup& s = {}) {
        TinyModel& m = TinyModel::get();
        ServerOptions o;
        o.model_dir = m.path();
        o.model_id = "tiny";
        o.cfg = m.cfg;
        o.limits.vocab_size = m.cfg.vocab_size;
        o.limits.max_prompt_tokens = s.max_prompt_tokens;
        o.scheduler.max_batch_tokens = s.max_batch_tokens;
        o.scheduler.max_queue = s.max_queue;
        o.scheduler.hold_batches = s.hold_batches;
        o.log_requests = false;
        server_ = std::make_unique<PrefillServer>(o);
        port_ = server_->start("127.0.0.1", 0);
        BatchRunner engine = [e = m.served.get()](const std::vector<std::vector<int32_t>>& p,
                                                  const RunOptions& ro) { return e->run(p, ro); };
        ready_.runners = {s.wrap ? BatchRunner([engine, w = s.wrap](const auto& p, const auto& ro) {
            return w(p, ro, engine);
        })
                                 : engine};
        if (s.ready) make_ready();
    }
    ~TestServer() {
        server_->stop();
        server_->wait();
    }
    void make_ready() { server_->set_ready(ready_); }
    PrefillServer& server() { return *server_; }
    int port() const { return port_; }
    std::unique_ptr<httplib::Client> client() const {
        auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
        c->set_read_timeout(60, 0);
        c->set_connection_timeout(10, 0);
        return c;
    }
    // POST `path` with a JSON body; status -1 when the request failed on the wire.
    std::pair<int, nlohmann::json> post(const std::string& path, const std::string& body,
                                        std::string* retry_after = nullptr) const {
        auto r = client()->Post(path.c_str(), body, "application/json");
        if (!r) return {-1, {}};
        if (retry_after) *retry_after = r->get_header_value("Retry-After");
        return {r->status, nlohmann::json::parse(r->body, nullptr, false)};
    }
    std::pair<int, std::string> get(const std::string& path) const {
        auto r = client()->Get(path.c_str());
        if (!r) return {-1, ""};
        return {r->status, r->body};
    }

  private:
    std::unique_ptr<PrefillServer> server_;
    ReadyModel ready_;
    int port_ = 0;
};

// log softmax(row)[id] in long double, straight from the definition.
inline double reference_logprob(const float* row, int64_t vocab, int32_t id) {
    long double z = 0;
    for (int64_t i = 0; i < vocab; ++i) z += std::exp(static_cast<long double>(row[i]));
    return static_cast<double>(static_cast<long double>(row[id]) - std::log(z));
}

// The gap between the largest and second largest value of a row: a first-token comparison
// across different batchings is only meaningful where it is not a near-tie (docs/numerics.md).
inline double top_gap(const float* row, int64_t vocab) {
    float a = -INFINITY, b = -INFINITY;
    for (int64_t i = 0; i < vocab; ++i) {
        if (row[i] > a) {
            b = a;
            a = row[i];
        } else if (row[i] > b) {
            b = row[i];
        }
    }
    return double(a) - double(b);
}

}  // namespace cpfill::serve::test
