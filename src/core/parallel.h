// A small fixed-size thread pool and parallel_for for the CPU backend. One pool per CPU rank
// (passed in explicitly, never global). parallel_for splits [0, n) into contiguous chunks.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace cpfill {

class ThreadPool {
  public:
    explicit ThreadPool(int n_threads);  // n_threads <= 1: run everything on the caller
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return static_cast<int>(workers_.size()) + 1; }
    // Calls fn(begin, end) on disjoint chunks covering [0, n); returns when all are done.
    // Exceptions thrown by fn are rethrown here (the first one).
    void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

  private:
    void worker_loop(int index);

    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable cv_work_, cv_done_;
    const std::function<void(int64_t, int64_t)>* job_ = nullptr;
    int64_t job_n_ = 0;
    uint64_t generation_ = 0;
    int pending_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
};

// Threads to use by default: hardware concurrency, at least 1.
int default_thread_count();

}  // namespace cpfill
