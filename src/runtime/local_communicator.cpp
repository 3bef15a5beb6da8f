// LocalCommunicator: ranks are threads of one process. Each collective is a rendezvous in shared
// memory: every rank posts (sequence, kind, count, buffers), waits for all peers (with a
// deadline), checks that the signatures agree, computes its own output from the peers' inputs
// (fixed rank order, so sums are deterministic), then waits until every peer has finished reading
// before its own input may be reused.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "core/error.h"
#include "runtime/communicator.h"

namespace cpfill {

std::string_view coll_kind_name(CollKind k) {
    switch (k) {
        case CollKind::AllGather:
            return "all_gather";
        case CollKind::ReduceScatter:
            return "reduce_scatter";
        case CollKind::AllReduce:
            return "all_reduce";
        case CollKind::Barrier:
            return "barrier";
    }
    return "?";
}

namespace {

struct Post {
    uint64_t seq = 0;
    CollKind kind = CollKind::Barrier;
    int64_t count = 0;
    const float* send = nullptr;
    float* recv = nullptr;
};

std::string describe(int rank, const Post& p) {
    return fmt::format("rank {} {} #{} of {} floats", rank, coll_kind_name(p.kind), p.seq, p.count);
}

// State shared by the ranks of one communicator (and the groups made by dup()).
struct Group {
    Group(int size, LocalCommOptions opt) : size(size), opt(opt), posts(size) {}
    const int size;
    const LocalCommOptions opt;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Post> posts;
    uint64_t arrived = 0, finished = 0;  // monotonic: size per completed collective
    std::string aborted;
    std::vector<std::shared_ptr<Group>> dups;

    // Waits until `counter` reaches `target`; throws on abort or deadline.
    void wait_for(std::unique_lock<std::mutex>& lock, const uint64_t& counter, uint64_t target,
                  int rank, const Post& p, const char* phase) {
        bool ok =
            cv.wait_for(lock, opt.deadline, [&] { return counter >= target || !aborted.empty(); });
        if (!aborted.empty())
            CPFILL_FAIL("{}: communicator aborted: {}", describe(rank, p), aborted);
        if (!ok) {
            std::vector<int> missing;
            for (int r = 0; r < size; ++r)
                if (posts[r].seq < p.seq) missing.push_back(r);
            std::string why = fmt::format(
                "{}: peers did not {} within {} ms (ranks not yet at this collective: {})",
                describe(rank, p), phase, opt.deadline.count(),
                missing.empty() ? std::string("none")
                                : fmt::format("{}", fmt::join(missing, ", ")));
            aborted = why;
            cv.notify_all();
            CPFILL_FAIL("{}", why);
        }
    }
};

class LocalCommunicator final : public Communicator {
  public:
    LocalCommunicator(std::shared_ptr<Group> g, int rank)
        : g_(std::move(g)), rank_(rank), rng_(g_->opt.delay_seed * 7919 + rank) {}
    int rank() const override { return rank_; }
    int size() const override { return g_->size; }

    void all_gather(const float* send, float* recv, int64_t count, Stream& s) override {
        submit(CollKind::AllGather, send, recv, count, s);
    }
    void reduce_scatter(const float* send, float* recv, int64_t count, Stream& s) override {
        submit(CollKind::ReduceScatter, send, recv, count, s);
    }
    void all_reduce(const float* send, float* recv, int64_t count, Stream& s) override {
        submit(CollKind::AllReduce, send, recv, count, s);
    }
    void barrier(Stream& s) override { submit(CollKind::Barrier, nullptr, nullptr, 0, s); }

    std::unique_ptr<Communicator> dup() override {
        std::shared_ptr<Group> d;
        {
            std::lock_guard<std::mutex> lock(g_->mu);
            if (g_->dups.size() <= dup_calls_)
                g_->dups.push_back(std::make_shared<Group>(g_->size, g_->opt));
            d = g_->dups[dup_calls_++];
        }
        return std::make_unique<LocalCommunicator>(d, rank_);
    }

    void abort(const std::string& why) override {
        std::lock_guard<std::mutex> lock(g_->mu);
        if (g_->aborted.empty()) g_->aborted = fmt::format("rank {} failed: {}", rank_, why);
        g_->cv.notify_all();
        for (auto& d : g_->dups) {
            std::lock_guard<std::mutex> dl(d->mu);
            if (d->aborted.empty()) d->aborted = g_->aborted;
            d->cv.notify_all();
        }
    }

  private:
    void submit(CollKind kind, const float* send, float* recv, int64_t count, Stream& s) {
        Post p{++seq_, kind, count, send, recv};
        int delay = 0;
        if (g_->opt.max_delay_us > 0)
            delay = static_cast<int>(rng_() % static_cast<uint64_t>(g_->opt.max_delay_us + 1));
        s.enqueue([this, p, delay] {
            if (delay) std::this_thread::sleep_for(std::chrono::microseconds(delay));
            run(p);
        });
    }

    void run(const Post& p) {
        const int C = g_->size;
        std::unique_lock<std::mutex> lock(g_->mu);
        g_->posts[rank_] = p;
        g_->arrived += 1;
        g_->cv.notify_all();
        g_->wait_for(lock, g_->arrived, p.seq * C, rank_, p, "arrive");
        if (g_->opt.check)
            for (int r = 0; r < C; ++r) {
                const Post& q = g_->posts[r];
                if (q.seq != p.seq || q.kind != p.kind || q.count != p.count) {
                    std::string why = fmt::format("collective mismatch: {} but {}",
                                                  describe(rank_, p), describe(r, q));
                    g_->aborted = why;
                    g_->cv.notify_all();
                    CPFILL_FAIL("{}", why);
                }
            }
        lock.unlock();
        compute(p);
        lock.lock();
        g_->finished += 1;
        g_->cv.notify_all();
        g_->wait_for(lock, g_->finished, p.seq * C, rank_, p, "finish");
        if (p.kind == CollKind::AllReduce)
            std::memcpy(p.recv, staged_.data(), p.count * sizeof(float));
    }

    // Reads peers' inputs (stable until every rank has finished), writes only this rank's output.
    void compute(const Post& p) {
        const int C = g_->size;
        const int64_t n = p.count;
        const auto& posts = g_->posts;
        switch (p.kind) {
            case CollKind::AllGather:
                for (int r = 0; r < C; ++r)
                    std::memmove(p.recv + r * n, posts[r].send, n * sizeof(float));
                break;
            case CollKind::ReduceScatter: {
                std::vector<float> acc(posts[0].send + rank_ * n, posts[0].send + (rank_ + 1) * n);
                for (int r = 1; r < C; ++r)
                    for (int64_t i = 0; i < n; ++i) acc[i] += posts[r].send[rank_ * n + i];
                std::memcpy(p.recv, acc.data(), n * sizeof(float));
                break;
            }
            case CollKind::AllReduce: {
                std::vector<float> acc(posts[0].send, posts[0].send + n);
                for (int r = 1; r < C; ++r)
                    for (int64_t i = 0; i < n; ++i) acc[i] += posts[r].send[i];
                // recv may alias send, which peers read until the finish phase: copy after it.
                staged_ = std::move(acc);
                break;
            }
            case CollKind::Barrier:
                break;
        }
    }

    std::shared_ptr<Group> g_;
    int rank_;
    uint64_t seq_ = 0;
    size_t dup_calls_ = 0;
    std::mt19937_64 rng_;
    std::vector<float> staged_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_local_communicators(int size,
                                                                    const LocalCommOptions& opt) {
    CPFILL_CHECK(size >= 1, "communicator size must be at least 1, found {}", size);
    auto g = std::make_shared<Group>(size, opt);
    std::vector<std::unique_ptr<Communicator>> out;
    for (int r = 0; r < size; ++r) out.push_back(std::make_unique<LocalCommunicator>(g, r));
    return out;
}

}  // namespace cpfill
