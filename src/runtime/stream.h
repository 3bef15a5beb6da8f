// CPU streams and events (docs/design.md §5; docs/conventions.md "Runtime abstractions"). A Stream
// runs queued work in order on its own worker thread, so a comm stream really runs beside the
// compute thread. An Event marks a point in a stream: record() enqueues the marker, wait() blocks
// until it has run. Errors thrown by queued work are kept in the stream and rethrown by the next
// wait on an event recorded after them, so a failure is never lost.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace cpfill {

class Event {
  public:
    Event();
    // Blocks until the marker has run; throws the stream's error (if any) or cpfill::Error after
    // `timeout` naming `what`.
    void wait(std::chrono::milliseconds timeout, const std::string& what) const;
    bool query() const;  // has the marker run?

  private:
    friend class Stream;
    struct State;
    std::shared_ptr<State> state_;
};

class Stream {
  public:
    // Worker streams run work on their own thread. An inline stream runs each piece of work at once
    // in the calling thread (the CPU backend's compute stream: the rank thread itself).
    enum class Kind { Worker, Inline };
    Stream(std::string name, Kind kind);
    ~Stream();  // drains the queue, then joins
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;

    const std::string& name() const { return name_; }
    void enqueue(std::function<void()> work);
    // Re-arms `event` and enqueues its marker behind everything queued so far.
    void record(Event& event);
    // Enqueues a wait: later work on this stream starts only after `event` has run.
    void wait_event(const Event& event, std::chrono::milliseconds timeout);
    // Blocks the caller until everything queued so far has run; rethrows a queued error.
    void synchronize(std::chrono::milliseconds timeout);

  private:
    void loop();
    void push(std::function<void()> work, bool marker);

    std::string name_;
    std::mutex mu_;
    std::condition_variable cv_;
    struct Item {
        std::function<void()> work;
        bool marker;  // event markers still run after an error; other work is skipped
    };
    std::deque<Item> queue_;
    bool stop_ = false;
    std::exception_ptr error_;  // first error of queued work, reported through events
    Kind kind_;
    std::thread worker_;
};

}  // namespace cpfill
