// ThreadPool: workers wait for a generation counter to change, run their chunk, report done.
#include "core/parallel.h"

#include <algorithm>

namespace cpfill {

ThreadPool::ThreadPool(int n_threads) {
    for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_work_.notify_all();
    for (auto& w : workers_) w.join();
}

static void run_chunk(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int index,
                      int parts) {
    int64_t begin = n * index / parts, end = n * (index + 1) / parts;
    if (begin < end) fn(begin, end);
}

void ThreadPool::worker_loop(int index) {
    uint64_t seen = 0;
    for (;;) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_work_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        const auto* job = job_;
        int64_t n = job_n_;
        lock.unlock();
        std::exception_ptr err;
        try {
            run_chunk(*job, n, index, size());
        } catch (...) {
            err = std::current_exception();
        }
        lock.lock();
        if (err && !error_) error_ = err;
        if (--pending_ == 0) cv_done_.notify_one();
    }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    if (workers_.empty() || n == 1) {
        fn(0, n);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        job_ = &fn;
        job_n_ = n;
        pending_ = static_cast<int>(workers_.size());
        error_ = nullptr;
        ++generation_;
    }
    cv_work_.notify_all();
    std::exception_ptr mine;
    try {
        run_chunk(fn, n, 0, size());
    } catch (...) {
        mine = std::current_exception();
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
}

int default_thread_count() { return std::max(1u, std::thread::hardware_concurrency()); }

}  // namespace cpfill
