// A progress line for long loads on stderr: bytes done / total, rate and ETA, redrawn in place
// with '\r'. Drawn only when enabled, stderr is a terminal and the work has run for over a
// second, so short loads, tests and redirected logs stay silent. add() is thread-safe: workers
// report bytes as they finish pieces, whichever one gets the lock redraws (at most 10 times/s).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <string>

namespace cpfill {

// The line itself, for `done` of `total` bytes after `seconds`:
// "loading   1.23 / 4.56 GB [#####-----]  27%  0.98 GB/s  ETA 3 s".
std::string progress_line(const std::string& label, size_t done, size_t total, double seconds);

class Progress {
  public:
    // `enabled` asks for the line; it is drawn only if stderr is also a terminal.
    Progress(std::string label, size_t total_bytes, bool enabled);
    ~Progress();  // finish()
    Progress(const Progress&) = delete;
    Progress& operator=(const Progress&) = delete;

    void add(size_t bytes);  // thread-safe
    // Draws the final state and ends the line if anything was drawn. Idempotent, never throws.
    void finish() noexcept;
    double seconds() const;

  private:
    void draw(size_t done, bool final) noexcept;

    std::string label_;
    size_t total_;
    bool enabled_;
    std::chrono::steady_clock::time_point start_;
    std::atomic<size_t> done_{0};
    std::mutex draw_mu_;
    double last_draw_ = 0;  // seconds, under draw_mu_
    bool drawn_ = false;    // under draw_mu_
    bool finished_ = false;
};

}  // namespace cpfill
