// The scheduler over a fake model (fake_runner.h): batches in arrival order up to the token
// budget, one kind of output per batch, over-budget prompts chunked (or 413), a full queue 503, a
// failed batch 500 to its own requests only, shutdown, clients gone. Batches are held
// (hold_batches) until the test has queued what it needs, so nothing depends on timing; every
// wait is bounded.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "fake_runner.h"
#include "serve/http_error.h"

namespace cpfill::serve {
namespace {

using test::FakeRunner;

// Polls `pred` for up to 20 s.
template <typename Pred>
bool eventually(Pred pred) {
    for (int i = 0; i < 20000; ++i) {
        if (pred()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return pred();
}

JobSpec job(std::vector<int32_t> ids, bool all_logits = false) {
    JobSpec s;
    s.prompts = {std::move(ids)};
    s.all_logits = all_logits;
    return s;
}

JobResult get(std::future<JobResult>& f) {
    EXPECT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    return f.get();
}

SchedulerOptions held(int64_t budget, size_t queue = 16) {
    SchedulerOptions o;
    o.max_batch_tokens = budget;
    o.max_queue = queue;
    o.hold_batches = true;
    return o;
}

TEST(Scheduler, BatchesInArrivalOrderUpToTheTokenBudget) {
    FakeRunner fake;
    Scheduler s(fake.runner(), held(10));
    auto a = s.submit(job({1, 2, 3, 4}));
    ASSERT_TRUE(eventually([&] { return s.batch_held(); }));
    auto b = s.submit(job({5, 6, 7}));
    auto c = s.submit(job({8, 9, 10}));
    auto d = s.submit(job({11, 12, 13, 14, 15}));
    auto e = s.submit(job({16, 17}));
    EXPECT_EQ(s.queue_length(), 4u);
    for (int i = 0; i < 3; ++i) s.release_batch();
    const JobResult ra = get(a), rb = get(b), rc = get(c), rd = get(d), re = get(e);
    const auto calls = fake.snapshot();
    ASSERT_EQ(calls.size(), 3u);
    using P = std::vector<std::vector<int32_t>>;
    EXPECT_EQ(calls[0].prompts, (P{{1, 2, 3, 4}}));
    EXPECT_EQ(calls[1].prompts, (P{{5, 6, 7}, {8, 9, 10}}));  // + d would be 11 > 10
    EXPECT_EQ(calls[2].prompts, (P{{11, 12, 13, 14, 15}, {16, 17}}));
    EXPECT_EQ(rb.batch_jobs, 2u);
    EXPECT_EQ(rd.batch_tokens, 7);
    for (const auto& [r, p] : std::vector<std::pair<JobResult, std::vector<int32_t>>>{
             {ra, {1, 2, 3, 4}}, {rb, {5, 6, 7}}, {rc, {8, 9, 10}}, {re, {16, 17}}}) {
        EXPECT_EQ(r.status, 200);
        ASSERT_EQ(r.first_tokens.size(), 1u);
        EXPECT_EQ(r.first_tokens[0], FakeRunner::expected_token(p));
        EXPECT_EQ(r.logits[0].f32()[FakeRunner::expected_token(p)], 1.0f);
    }
}

TEST(Scheduler, AllPositionLogitsAndKvStartTheirOwnBatch) {
    FakeRunner fake;
    Scheduler s(fake.runner(), held(100));
    auto a = s.submit(job({1}));
    ASSERT_TRUE(eventually([&] { return s.batch_held(); }));
    auto b = s.submit(job({2}));
    auto c = s.submit(job({3}, /*all_logits=*/true));
    JobSpec kv = job({4, 5});
    kv.keep_kv = true;
    auto d = s.submit(std::move(kv));
    for (int i = 0; i < 4; ++i) s.release_batch();
    get(a), get(b), get(c);
    const JobResult rd = get(d);
    const auto calls = fake.snapshot();
    ASSERT_EQ(calls.size(), 4u);
    EXPECT_FALSE(calls[1].options.all_logits);
    EXPECT_TRUE(calls[2].options.all_logits);
    EXPECT_EQ(calls[2].prompts.size(), 1u);
    EXPECT_TRUE(calls[3].options.keep_kv);
    ASSERT_EQ(rd.kv.size(), 1u);
    EXPECT_EQ(rd.kv[0][0].n_tokens, 2);
}

TEST(Scheduler, AnOverBudgetRequestRunsAloneInChunksOr413) {
    FakeRunner fake;
    SchedulerOptions o;
    o.max_batch_tokens = 10;
    {
        Scheduler s(fake.runner(), o);
        std::vector<int32_t> ids(25, 3);
        const JobResult r = s.submit(job(ids)).get();
        EXPECT_EQ(r.status, 200);
        ASSERT_EQ(fake.snapshot().size(), 1u);
        EXPECT_EQ(fake.snapshot()[0].options.chunk, 10);
        EXPECT_EQ(s.submit(job({1, 2})).get().status, 200);
        EXPECT_EQ(fake.snapshot()[1].options.chunk, 0);
    }
    o.chunk_long = false;  // the CUDA backend
    Scheduler s(fake.runner(), o);
    try {
        s.submit(job(std::vector<int32_t>(11, 1)));
        ADD_FAILURE() << "an 11-token request was queued under a budget of 10";
    } catch (const HttpError& e) {
        EXPECT_EQ(e.status(), 413);
        EXPECT_NE(std::string(e.what()).find("--max-batch-tokens 10"), std::string::npos)
            << e.what();
    }
}

TEST(Scheduler, AFullQueueIs503) {
    FakeRunner fake;
    Scheduler s(fake.runner(), held(100, /*queue=*/2));
    auto a = s.submit(job({1}));
    ASSERT_TRUE(eventually([&] { return s.batch_held(); }));
    auto b = s.submit(job({2}));
    auto c = s.submit(job({3}));
    try {
        s.submit(job({4}));
        ADD_FAILURE() << "a third request was queued with --max-queue 2";
    } catch (const HttpError& e) {
        EXPECT_EQ(e.status(), 503);
        EXPECT_NE(std::string(e.what()).find("queue is full"), std::string::npos) << e.what();
    }
    s.release_batch();
    s.release_batch();
    EXPECT_EQ(get(a).status, 200);
    EXPECT_EQ(get(b).status, 200);
    EXPECT_EQ(get(c).status, 200);
}

TEST(Scheduler, AFailedBatchAnswers500ToItsRequestsOnly) {
    FakeRunner fake;
    Scheduler s(fake.runner(), held(7));
    auto a = s.submit(job({1, 2}));
    ASSERT_TRUE(eventually([&] { return s.batch_held(); }));
    auto b = s.submit(job({3, test::kFailToken, 4}));
    auto c = s.submit(job({5, 6, 7}));
    auto d = s.submit(job({8, 9}));  // 3 + 3 + 2 > 7: the next batch
    for (int i = 0; i < 3; ++i) s.release_batch();
    EXPECT_EQ(get(a).status, 200);
    const JobResult rb = get(b), rc = get(c), rd = get(d);
    EXPECT_EQ(rb.status, 500);
    EXPECT_EQ(rc.status, 500);
    EXPECT_NE(rc.error_message.find("injected failure"), std::string::npos) << rc.error_message;
    EXPECT_EQ(rd.status, 200);
    EXPECT_EQ(rd.first_tokens[0], FakeRunner::expected_token({8, 9}));
}

TEST(Scheduler, ShutdownFinishesTheRunningBatchAndAnswersTheQueued503) {
    FakeRunner fake;
    Scheduler s(fake.runner(), held(100));
    auto a = s.submit(job({1, 2}));
    ASSERT_TRUE(eventually([&] { return s.batch_held(); }));
    auto b = s.submit(job({3}));
    s.shutdown();  // releases the held batch, which runs
    const JobResult ra = get(a), rb = get(b);
    EXPECT_EQ(ra.status, 200);
    EXPECT_EQ(ra.first_tokens[0], FakeRunner::expected_token({1, 2}));
    EXPECT_EQ(rb.status, 503);
    EXPECT_EQ(fake.snapshot().size(), 1u);
    try {
        s.submit(job({4}));
        ADD_FAILURE() << "queued after shutdown";
    } catch (const HttpError& e) {
        EXPECT_EQ(e.status(), 503);
    }
}

TEST(Scheduler, AClientGoneBeforeItsBatchIsDropped) {
    FakeRunner fake;
    Scheduler s(fake.runner(), held(100));
    auto a = s.submit(job({1}));
    ASSERT_TRUE(eventually([&] { return s.batch_held(); }));
    JobSpec gone = job({2, 2});
    gone.client_gone = [] { return true; };
    auto b = s.submit(std::move(gone));
    auto c = s.submit(job({3}));
    s.release_batch();
    s.release_batch();
    get(a);
    EXPECT_EQ(get(b).status, 499);
    EXPECT_EQ(get(c).status, 200);
    const auto calls = fake.snapshot();
    ASSERT_EQ(calls.size(), 2u);
    EXPECT_EQ(calls[1].prompts, (std::vector<std::vector<int32_t>>{{3}}));
}

// Two replicas: a batch held on one does not hold the queue; the other replica forms and runs the
// next batch meanwhile, and each batch goes to exactly one replica.
TEST(Scheduler, ReplicasRunBatchesSideBySide) {
    FakeRunner one, two;
    Scheduler s(std::vector<BatchRunner>{one.runner(), two.runner()}, held(4));
    EXPECT_EQ(s.replicas(), 2);
    auto a = s.submit(job({1, 2, 3, 4}));
    ASSERT_TRUE(eventually([&] { return s.batches_running() == 1; }));
    auto b = s.submit(job({5, 6, 7}));
    ASSERT_TRUE(eventually([&] { return s.batches_running() == 2; }));
    EXPECT_EQ(s.queue_length(), 0u);
    auto c = s.submit(job({8}));  // both replicas busy: it waits
    EXPECT_EQ(s.queue_length(), 1u);
    for (int i = 0; i < 3; ++i) s.release_batch();
    const JobResult ra = get(a), rb = get(b), rc = get(c);
    EXPECT_EQ(ra.first_tokens.at(0), FakeRunner::expected_token({1, 2, 3, 4}));
    EXPECT_EQ(rb.first_tokens.at(0), FakeRunner::expected_token({5, 6, 7}));
    EXPECT_EQ(rc.first_tokens.at(0), FakeRunner::expected_token({8}));
    const size_t n1 = one.snapshot().size(), n2 = two.snapshot().size();
    EXPECT_EQ(n1 + n2, 3u);
    EXPECT_GE(n1, 1u);
    EXPECT_GE(n2, 1u);
}

}  // namespace
}  // namespace cpfill::serve
