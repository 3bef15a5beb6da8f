// StoredReader: reads a checkpoint's stored weight bytes for the GPU upload, ahead of it, into
// pinned host memory (docs/loading.md, "GPU upload from stored bytes"). The upload plan is a
// sequence of pieces (rows of one weight's slab, with the scale rows they use); `threads` threads
// copy them in plan order from the checkpoint's mapping into a ring of pinned slots, while the
// ranks' upload threads take them by weight and rows, copy them to their GPU and release them. A
// slot is reused once every rank that needs its piece has released it. A request the plan did
// not foresee (or one the readers have not reached) is read on the spot into memory of the
// request's own: slower, never a wait that could not end.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "io/checkpoint.h"
#include "io/progress.h"

namespace cpfill::cuda {

// Rows [r0, r1) of weight `name`'s slab, needed by `users` upload threads.
struct StoredPiece {
    std::string name;
    int64_t r0 = 0, r1 = 0;
    int users = 1;
};

// The bytes of a piece: its slab rows (row_bytes apart) and the scale rows they use
// (StoredSlab::scale_rows); `pinned` when they lie in page-locked memory. `entry` >= 0: a slot
// of the ring, held until released; −1: memory of the read's own, freed when its `use` returns
// (a copy from pageable memory has read it by the time cudaMemcpy*Async returns).
struct PieceBytes {
    const uint8_t* w = nullptr;
    const uint8_t* s = nullptr;
    int64_t r0 = 0, r1 = 0;
    bool pinned = false;
    int64_t entry = -1;
};

// The upload plan: the pieces in the order the upload asks for them, and every weight's slab.
struct StoredPlan {
    std::vector<StoredPiece> pieces;
    std::map<std::string, StoredSlab> slabs;
    size_t max_piece_bytes = 0;
    size_t stored_bytes = 0;  // of all pieces (piece_stored_bytes)
};

// Bytes a piece takes in a slot: its weight rows, then its scale rows at a 256-byte boundary.
size_t piece_bytes(const StoredSlab& slab, int64_t r0, int64_t r1);

// The stored bytes of a piece: its rows and scale rows, without the slot's padding.
size_t piece_stored_bytes(const StoredSlab& slab, int64_t r0, int64_t r1);

// Rows of `slab` per piece so that a piece takes at most `max_bytes` (at least one row, or 128
// for fp8 so that pieces start on scale rows).
int64_t rows_per_piece(const StoredSlab& slab, size_t max_bytes);

class StoredReader {
  public:
    // Starts `threads` reader threads over `plan` with `slots` pinned slots, each holding the
    // plan's largest piece. `bar` (may be null) counts the bytes copied. `device` (>= 0): the GPU
    // whose context the readers allocate the page-locked slots in (under mpirun a process's own,
    // so that no process makes a context on GPU 0); −1: the calling thread's current device.
    StoredReader(const Checkpoint& ck, StoredPlan plan, int threads, int slots, Progress* bar,
                 int device = -1);
    ~StoredReader();  // stops the readers and frees the slots
    StoredReader(const StoredReader&) = delete;
    StoredReader& operator=(const StoredReader&) = delete;

    // Calls use(bytes) for each piece covering rows [r0, r1) of `name` (in row order; a piece may
    // start before r0 and end after r1), the piece held for the call, or with `defer` until
    // release(bytes.entry) (for asynchronous copies out of it: a CUDA host function after them).
    // Thread-safe.
    void read(const std::string& name, int64_t r0, int64_t r1,
              const std::function<void(const PieceBytes&)>& use, bool defer = false);
    // Ends a deferred hold of a ring slot (PieceBytes::entry >= 0). Thread-safe; makes no CUDA
    // call, so a CUDA host function may call it.
    void release(int64_t entry);
    // Weight `name`'s slab (the plan's, or looked up). Thread-safe; the reference stays valid.
    const StoredSlab& slab(const std::string& name);
    size_t slot_bytes() const { return slot_bytes_; }
    // Wakes and stops the readers (an upload thread failed); read() then reads on the spot.
    void abort();
    size_t bytes_read() const;  // stored bytes copied so far (planned and on the spot)
    size_t misses() const;      // pieces read on the spot
    // Seconds the reader threads waited for a free slot (summed: the GPUs were the bottleneck)
    // and the uploads waited for a piece being read (summed: reading was).
    double reader_wait_seconds() const;
    double upload_wait_seconds() const;

  private:
    enum class State : uint8_t { Waiting, Reading, Ready, Skipped, Done };
    struct Entry {
        StoredPiece piece;
        State state = State::Waiting;
        int slot = -1, released = 0, in_use = 0;
    };
    void reader_loop();
    void copy_piece(const StoredSlab& sl, int64_t r0, int64_t r1, uint8_t* dst) const;
    void read_now(const StoredSlab& sl, int64_t r0, int64_t r1,
                  const std::function<void(const PieceBytes&)>& use);
    void release_locked(Entry& e);  // under mu_
    void allocate_slot(int s);
    const StoredSlab& slab_of(const std::string& name);  // cached, under mu_ (or before threads)

    const Checkpoint& ck_;
    std::vector<Entry> plan_;
    std::map<std::string, std::vector<size_t>> by_name_;  // plan indices per weight, row order
    std::map<std::string, StoredSlab> slabs_;
    size_t slot_bytes_;
    std::vector<uint8_t*> slots_;      // allocated on first use
    std::vector<char> slot_pageable_;  // page-locked memory was refused: plain memory instead
    std::vector<int> free_slots_;
    size_t next_ = 0;
    bool stop_ = false;
    int device_ = -1;
    Progress* bar_;
    size_t bytes_ = 0, misses_ = 0;
    double reader_wait_ = 0, upload_wait_ = 0;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<std::thread> threads_;
};

}  // namespace cpfill::cuda
