// Stream: one worker thread draining a FIFO; Event: a flag + generation under a mutex.
#include "runtime/stream.h"

#include "core/error.h"

namespace cpfill {

struct Event::State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = true;  // a never-recorded event is complete
    std::exception_ptr error;
};

Event::Event() : state_(std::make_shared<State>()) {}

bool Event::query() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->done;
}

void Event::wait(std::chrono::milliseconds timeout, const std::string& what) const {
    std::unique_lock<std::mutex> lock(state_->mu);
    if (!state_->cv.wait_for(lock, timeout, [&] { return state_->done; }))
        CPFILL_FAIL("timed out after {} ms waiting for {}", timeout.count(), what);
    if (state_->error) std::rethrow_exception(state_->error);
}

Stream::Stream(std::string name, Kind kind) : name_(std::move(name)), kind_(kind) {
    if (kind_ == Kind::Worker) worker_ = std::thread([this] { loop(); });
}

Stream::~Stream() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
}

void Stream::enqueue(std::function<void()> work) { push(std::move(work), false); }

void Stream::push(std::function<void()> work, bool marker) {
    if (kind_ == Kind::Inline) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (error_ && !marker) return;
        }
        try {
            work();
        } catch (...) {
            std::lock_guard<std::mutex> lock(mu_);
            if (!error_) error_ = std::current_exception();
            throw;
        }
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back({std::move(work), marker});
    }
    cv_.notify_all();
}

void Stream::record(Event& event) {
    auto st = event.state_;
    {
        std::lock_guard<std::mutex> lock(st->mu);
        st->done = false;
        st->error = nullptr;
    }
    push(
        [this, st] {
            std::exception_ptr err;
            {
                std::lock_guard<std::mutex> lock(mu_);
                err = error_;
            }
            std::lock_guard<std::mutex> lock(st->mu);
            st->error = err;
            st->done = true;
            st->cv.notify_all();
        },
        true);
}

void Stream::wait_event(const Event& event, std::chrono::milliseconds timeout) {
    Event copy = event;
    std::string what = "an event on stream " + name_;
    enqueue([copy, timeout, what] { copy.wait(timeout, what); });
}

void Stream::synchronize(std::chrono::milliseconds timeout) {
    Event e;
    record(e);
    e.wait(timeout, "stream " + name_ + " to drain");
}

void Stream::loop() {
    for (;;) {
        Item item;
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) return;  // stop_ and drained
            item = std::move(queue_.front());
            queue_.pop_front();
            if (error_ && !item.marker) continue;  // a failed stream runs nothing but markers
        }
        try {
            item.work();
        } catch (...) {
            std::lock_guard<std::mutex> lock(mu_);
            if (!error_) error_ = std::current_exception();
        }
    }
}

}  // namespace cpfill
