// The local communicator: collectives on exactly representable data for 1–8 rank threads, dup()
// ordering, a mismatched collective order, an abort and an absent rank ending in clear errors (each
// naming what ended the wait), comm-stream work running while the compute thread works, and delay
// injection.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/error.h"
#include "runtime/communicator.h"

namespace cpfill {
namespace {

using namespace std::chrono_literals;

// Runs fn(rank) on `size` threads; returns each rank's error message ("" when none).
std::vector<std::string> on_ranks(int size, const std::function<void(int)>& fn) {
    std::vector<std::string> errors(size);
    std::vector<std::thread> ts;
    for (int r = 0; r < size; ++r)
        ts.emplace_back([&, r] {
            try {
                fn(r);
            } catch (const std::exception& e) {
                errors[r] = e.what();
            }
        });
    for (auto& t : ts) t.join();
    return errors;
}

class Collectives : public ::testing::TestWithParam<int> {};

TEST_P(Collectives, ExactResultsOnEveryRank) {
    const int C = GetParam();
    const int64_t n = 5;
    auto comms = make_local_communicators(C, {});
    auto errors = on_ranks(C, [&](int r) {
        Stream s("comm", Stream::Kind::Worker);
        std::vector<float> send(C * n), gathered(C * n), scattered(n), reduced(C * n);
        for (int64_t i = 0; i < C * n; ++i) send[i] = float(100 * r + i);
        comms[r]->all_gather(send.data(), gathered.data(), n, s);
        comms[r]->reduce_scatter(send.data(), scattered.data(), n, s);
        comms[r]->all_reduce(send.data(), reduced.data(), C * n, s);
        comms[r]->barrier(s);
        s.synchronize(10s);
        for (int k = 0; k < C; ++k)
            for (int64_t i = 0; i < n; ++i) EXPECT_EQ(gathered[k * n + i], float(100 * k + i));
        for (int64_t i = 0; i < n; ++i) {
            float e = 0;
            for (int k = 0; k < C; ++k) e += float(100 * k + r * n + i);
            EXPECT_EQ(scattered[i], e) << "rank " << r << " i " << i;
        }
        for (int64_t i = 0; i < C * n; ++i) {
            float e = 0;
            for (int k = 0; k < C; ++k) e += float(100 * k + i);
            EXPECT_EQ(reduced[i], e);
        }
    });
    for (int r = 0; r < C; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Sizes, Collectives, ::testing::Values(1, 2, 3, 4, 8));

TEST(Communicator, DupHasItsOwnOrdering) {
    // Rank 0 uses the duplicate first, rank 1 the original first: with each communicator on its
    // own stream neither waits for the other.
    auto comms = make_local_communicators(2, {});
    auto errors = on_ranks(2, [&](int r) {
        auto dup = comms[r]->dup();
        Stream a("a", Stream::Kind::Worker), b("b", Stream::Kind::Worker);
        std::vector<float> x = {float(r)}, y(2), z(2);
        if (r == 0) {
            dup->all_gather(x.data(), y.data(), 1, b);
            comms[r]->all_gather(x.data(), z.data(), 1, a);
        } else {
            comms[r]->all_gather(x.data(), z.data(), 1, a);
            dup->all_gather(x.data(), y.data(), 1, b);
        }
        a.synchronize(5s);
        b.synchronize(5s);
        EXPECT_EQ(y, (std::vector<float>{0, 1}));
        EXPECT_EQ(z, (std::vector<float>{0, 1}));
    });
    EXPECT_EQ(errors[0], "");
    EXPECT_EQ(errors[1], "");
}

// The deadlines below are safety nets, not bounds under test: each case checks which mechanism
// ended the wait (the message says), so a loaded machine cannot fail it and a broken detection
// shows as the deadline's message instead of the expected one.
constexpr auto kSafetyNet = std::chrono::milliseconds(60000);

TEST(Communicator, MismatchedOrderIsAnErrorNamingBothSides) {
    LocalCommOptions opt;
    opt.deadline = kSafetyNet;
    auto comms = make_local_communicators(2, opt);
    auto errors = on_ranks(2, [&](int r) {
        Stream s("compute", Stream::Kind::Inline);
        std::vector<float> buf(8);
        if (r == 0)
            comms[r]->all_gather(buf.data(), buf.data(), 4, s);
        else
            comms[r]->reduce_scatter(buf.data(), buf.data(), 4, s);
    });
    for (int r = 0; r < 2; ++r) {
        // Detected by the signature check, not by the deadline running out.
        EXPECT_NE(errors[r].find("collective mismatch"), std::string::npos) << errors[r];
        EXPECT_EQ(errors[r].find("within"), std::string::npos) << errors[r];
        EXPECT_NE(errors[r].find("all_gather #1 of 4 floats"), std::string::npos) << errors[r];
        EXPECT_NE(errors[r].find("reduce_scatter #1 of 4 floats"), std::string::npos) << errors[r];
    }
}

TEST(Communicator, AbsentRankEndsInAnErrorAtTheDeadline) {
    LocalCommOptions opt;
    opt.deadline = 300ms;
    auto comms = make_local_communicators(3, opt);
    auto errors = on_ranks(3, [&](int r) {
        if (r == 2) return;  // never joins
        Stream s("compute", Stream::Kind::Inline);
        std::vector<float> buf(3);
        comms[r]->all_gather(buf.data(), buf.data(), 1, s);
    });
    // A rank's wait runs out and names the absent rank (and the other present one, had its thread
    // not yet arrived); it wakes the other with that reason.
    const std::string key = "ranks not yet at this collective: ";
    for (int r = 0; r < 2; ++r) {
        EXPECT_NE(errors[r].find("all_gather #1"), std::string::npos) << errors[r];
        EXPECT_NE(errors[r].find("did not arrive within 300 ms"), std::string::npos) << errors[r];
        const size_t at = errors[r].find(key);
        ASSERT_NE(at, std::string::npos) << errors[r];
        const std::string list =
            errors[r].substr(at + key.size(), errors[r].find(')', at) - at - key.size());
        EXPECT_TRUE(list == "2" || list == "0, 2" || list == "1, 2") << errors[r];
    }
    EXPECT_EQ(errors[2], "");
}

TEST(Communicator, AbortStopsPeersAtOnce) {
    LocalCommOptions opt;
    opt.deadline = kSafetyNet;
    auto comms = make_local_communicators(2, opt);
    auto errors = on_ranks(2, [&](int r) {
        if (r == 1) {
            comms[r]->abort("out of memory");
            return;
        }
        Stream s("compute", Stream::Kind::Inline);
        std::vector<float> buf(2);
        comms[r]->all_gather(buf.data(), buf.data(), 1, s);
    });
    // Woken by the abort, not by the deadline running out.
    EXPECT_NE(errors[0].find("communicator aborted: rank 1 failed: out of memory"),
              std::string::npos)
        << errors[0];
    EXPECT_EQ(errors[0].find("within"), std::string::npos) << errors[0];
    EXPECT_EQ(errors[1], "");
}

TEST(Communicator, CommStreamRunsWhileComputeWorks) {
    // Each rank launches an all-gather on its comm stream and then keeps its own thread busy,
    // only polling the event: the collective completes during that work, not at a later wait.
    auto comms = make_local_communicators(2, {});
    std::atomic<int> completed_while_busy{0};
    auto errors = on_ranks(2, [&](int r) {
        Stream comm("comm", Stream::Kind::Worker);
        std::vector<float> x = {float(r + 1)}, y(2);
        comms[r]->all_gather(x.data(), y.data(), 1, comm);
        Event e;
        comm.record(e);
        const auto t0 = std::chrono::steady_clock::now();
        volatile double work = 0;
        while (!e.query() && std::chrono::steady_clock::now() - t0 < 5s)
            for (int i = 0; i < 1000; ++i) work = work + i;  // "compute"
        if (e.query()) completed_while_busy++;
        e.wait(5s, "all_gather");
        EXPECT_EQ(y, (std::vector<float>{1, 2}));
    });
    EXPECT_EQ(completed_while_busy.load(), 2);
    EXPECT_EQ(errors[0] + errors[1], "");
}

TEST(Communicator, DelayInjectionExposesAMissingWait) {
    // Right after the launch, with delays injected, the collective has not yet run: a reader that
    // forgot finish() would see stale data. Observed without reading the output (which would be a
    // data race): a marker recorded behind the collective has not run yet.
    LocalCommOptions opt;
    opt.max_delay_us = 50000;
    opt.delay_seed = 3;
    auto comms = make_local_communicators(2, opt);
    std::atomic<int> stale{0};
    auto errors = on_ranks(2, [&](int r) {
        Stream comm("comm", Stream::Kind::Worker);
        std::vector<float> x = {7.0f}, y(2, -1.0f);
        for (int rep = 0; rep < 4; ++rep) {
            y.assign(2, -1.0f);
            comms[r]->all_gather(x.data(), y.data(), 1, comm);
            Event done;
            comm.record(done);
            if (!done.query()) stale++;  // what a missing wait would read too early
            comm.synchronize(5s);
            EXPECT_EQ(y[0], 7.0f);
        }
    });
    EXPECT_GT(stale.load(), 0);
    EXPECT_EQ(errors[0] + errors[1], "");
}

TEST(Stream, ErrorsReachTheNextEvent) {
    Stream s("w", Stream::Kind::Worker);
    s.enqueue([] { CPFILL_FAIL("boom"); });
    bool ran_after = false;
    s.enqueue([&] { ran_after = true; });
    Event e;
    s.record(e);
    EXPECT_THROW(e.wait(5s, "x"), Error);
    EXPECT_FALSE(ran_after);
}

}  // namespace
}  // namespace cpfill
