// Progress: an atomic byte counter; the drawing thread is whichever add() wins a try_lock.
#include "io/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

namespace cpfill {

namespace {
constexpr double kShowAfterSeconds = 1.0;
constexpr double kRedrawSeconds = 0.1;
constexpr int kBarWidth = 24;
}  // namespace

std::string progress_line(const std::string& label, size_t done, size_t total, double seconds) {
    const double gb = 1e-9;
    const double frac = total ? std::min(1.0, static_cast<double>(done) / total) : 1.0;
    const int filled = static_cast<int>(frac * kBarWidth);
    const double rate = seconds > 0 ? done * gb / seconds : 0.0;  // GB/s
    std::string eta = "ETA   ?";
    if (done >= total)
        eta = fmt::format("in {:.1f} s", seconds);
    else if (rate > 0)
        eta = fmt::format("ETA {:.0f} s", (total - done) * gb / rate);
    return fmt::format("{} {:7.2f} / {:.2f} GB [{}{}] {:3.0f}%  {:.2f} GB/s  {}", label, done * gb,
                       total * gb, std::string(filled, '#'), std::string(kBarWidth - filled, '-'),
                       100.0 * frac, rate, eta);
}

Progress::Progress(std::string label, size_t total_bytes, bool enabled)
    : label_(std::move(label)),
      total_(total_bytes),
      enabled_(enabled && ::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { finish(); }

double Progress::seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::add(size_t bytes) {
    const size_t done = done_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    if (!enabled_) return;
    std::unique_lock<std::mutex> lock(draw_mu_, std::try_to_lock);
    if (!lock.owns_lock() || finished_) return;  // another thread is drawing
    draw(done, false);
}

void Progress::draw(size_t done, bool final) noexcept {
    const double t = seconds();
    if (!final && (t < kShowAfterSeconds || t - last_draw_ < kRedrawSeconds)) return;
    if (final && !drawn_) return;  // a short load: nothing was shown, nothing to end
    last_draw_ = t;
    drawn_ = true;
    try {
        const std::string line = progress_line(label_, done, total_, t);
        std::fprintf(stderr, "\r%s\033[K%s", line.c_str(), final ? "\n" : "");
        std::fflush(stderr);
    } catch (...) {  // a progress line is not worth failing (or terminating) the load for
    }
}

void Progress::finish() noexcept {
    if (!enabled_) return;
    std::lock_guard<std::mutex> lock(draw_mu_);
    if (finished_) return;
    finished_ = true;
    draw(done_.load(), true);
}

}  // namespace cpfill
