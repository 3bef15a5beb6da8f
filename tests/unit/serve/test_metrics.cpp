// /metrics text: parses as Prometheus exposition, and the counters and histograms add up to what
// was recorded.
#include <gtest/gtest.h>

#include "prometheus_parse.h"
#include "serve/metrics.h"

namespace cpfill::serve {
namespace {

TEST(Metrics, RendersWhatWasRecorded) {
    Metrics m;
    m.record_request("prefill", 200, 10, 0.002, 0.03, true);
    m.record_request("prefill", 200, 5, 0.0, 0.7, true);
    m.record_request("prefill", 400, 0, 0, 0, false);
    m.record_request("completions", 500, 7, 0.1, 0.2, true);
    m.record_batch(15, 0.5, true);
    m.record_batch(7, 0, false);
    MetricsGauges g;
    g.queue_length = 3;
    g.ready = true;
    g.load_seconds = 1.5;
    g.gpu_bytes_in_use = {100, 200};
    const test::Samples s = test::parse_prometheus(m.render(g));
    EXPECT_EQ(s.get("cpfill_requests_total{endpoint=\"prefill\",status=\"200\"}"), 2);
    EXPECT_EQ(s.get("cpfill_requests_total{endpoint=\"prefill\",status=\"400\"}"), 1);
    EXPECT_EQ(s.sum("cpfill_requests_total"), 4);
    EXPECT_EQ(s.get("cpfill_prompt_tokens_total"), 22);  // the 400 never ran
    EXPECT_EQ(s.get("cpfill_batches_total"), 2);
    EXPECT_EQ(s.get("cpfill_batches_failed_total"), 1);
    EXPECT_EQ(s.get("cpfill_tokens_per_second"), 30);
    EXPECT_EQ(s.get("cpfill_queue_length"), 3);
    EXPECT_EQ(s.get("cpfill_ready"), 1);
    EXPECT_EQ(s.get("cpfill_load_seconds"), 1.5);
    EXPECT_EQ(s.get("cpfill_gpu_memory_used_bytes{gpu=\"1\"}"), 200);
    EXPECT_EQ(s.get("cpfill_ttft_seconds_count"), 2);  // successful requests only
    EXPECT_NEAR(s.get("cpfill_ttft_seconds_sum"), 0.73, 1e-12);
    EXPECT_EQ(s.get("cpfill_ttft_seconds_bucket{le=\"0.05\"}"), 1);
    EXPECT_EQ(s.get("cpfill_ttft_seconds_bucket{le=\"1\"}"), 2);
    EXPECT_EQ(s.get("cpfill_queue_seconds_count"), 3);
    EXPECT_EQ(s.get("cpfill_queue_seconds_bucket{le=\"0.001\"}"), 1);  // 0 s
}

}  // namespace
}  // namespace cpfill::serve
