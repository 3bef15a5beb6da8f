// StoredReader (stored_reader.h): a ring of pinned slots filled in plan order by reader threads.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "model/cuda/stored_reader.h"

namespace cpfill::cuda {

namespace {

constexpr size_t kAlign = 256;

// Waits on cv under lk until pred, adding the seconds waited to *sum.
template <class Pred>
void timed_wait(std::condition_variable& cv, std::unique_lock<std::mutex>& lk, double* sum,
                Pred pred) {
    if (pred()) return;
    const auto t0 = std::chrono::steady_clock::now();
    cv.wait(lk, pred);
    *sum += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

size_t piece_bytes(const StoredSlab& slab, int64_t r0, int64_t r1) {
    const auto [s0, s1] = slab.scale_rows(r0, r1);
    return align_up(static_cast<size_t>((r1 - r0) * slab.row_bytes)) +
           static_cast<size_t>((s1 - s0) * slab.scale_row_bytes());
}

size_t piece_stored_bytes(const StoredSlab& slab, int64_t r0, int64_t r1) {
    const auto [s0, s1] = slab.scale_rows(r0, r1);
    return static_cast<size_t>((r1 - r0) * slab.row_bytes + (s1 - s0) * slab.scale_row_bytes());
}

int64_t rows_per_piece(const StoredSlab& slab, size_t max_bytes) {
    const int64_t srb = slab.s ? slab.scale_row_bytes() : 0;
    // Per row: its bytes and (fp4) its scale row; fp8 pieces also carry a scale row per 128 rows,
    // and one more when the w3 half's offset misaligns them.
    const int64_t per_row = slab.row_bytes + (slab.row_block == 1 ? srb : 0);
    const int64_t budget = static_cast<int64_t>(max_bytes) - static_cast<int64_t>(kAlign) -
                           2 * srb - (slab.row_block > 1 ? srb * (slab.rows / slab.row_block) : 0);
    int64_t rows = std::max<int64_t>(1, budget / std::max<int64_t>(per_row, 1));
    if (slab.row_block > 1) rows = std::max(slab.row_block, rows / slab.row_block * slab.row_block);
    return std::min(rows, std::max<int64_t>(slab.rows, 1));
}

StoredReader::StoredReader(const Checkpoint& ck, StoredPlan plan, int threads, int slots,
                           Progress* bar, int device)
    : ck_(ck),
      slabs_(std::move(plan.slabs)),
      slot_bytes_(align_up(std::max<size_t>(plan.max_piece_bytes, size_t{1} << 20))),
      bar_(bar) {
    CPFILL_CHECK(threads >= 1 && slots >= 1, "stored reader: {} threads, {} slots", threads, slots);
    plan_.reserve(plan.pieces.size());
    for (size_t i = 0; i < plan.pieces.size(); ++i) {
        StoredPiece& p = plan.pieces[i];
        const size_t n = piece_bytes(slab_of(p.name), p.r0, p.r1);
        CPFILL_CHECK(n <= slot_bytes_,
                     "stored reader: piece {} rows [{}, {}) takes {} bytes, slots hold {}", p.name,
                     p.r0, p.r1, n, slot_bytes_);
        by_name_[p.name].push_back(i);
        plan_.push_back(Entry{std::move(p)});
    }
    if (device < 0 && cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();  // no GPU: plain memory below
        device = -1;
    }
    device_ = device;
    slots_.assign(static_cast<size_t>(slots), nullptr);
    slot_pageable_.assign(static_cast<size_t>(slots), 0);
    for (int s = slots; s-- > 0;) free_slots_.push_back(s);
    for (int t = 0; t < threads; ++t) threads_.emplace_back([this] { reader_loop(); });
}

StoredReader::~StoredReader() {
    abort();
    for (std::thread& t : threads_) t.join();
    for (size_t s = 0; s < slots_.size(); ++s) {
        if (!slots_[s]) continue;
        if (slot_pageable_[s])
            std::free(slots_[s]);
        else
            cudaFreeHost(slots_[s]);
    }
}

void StoredReader::allocate_slot(int s) {
    // Page-locked, by the reader thread that first takes the slot (the pinning runs in parallel
    // and beside the reading); plain memory if the system refuses it.
    void* p = nullptr;
    if (device_ >= 0) (void)cudaSetDevice(device_);  // this reader thread's context
    if (cudaHostAlloc(&p, slot_bytes_, cudaHostAllocPortable) == cudaSuccess) {
        slots_[s] = static_cast<uint8_t*>(p);
        return;
    }
    (void)cudaGetLastError();
    slots_[s] = static_cast<uint8_t*>(std::malloc(slot_bytes_));
    CPFILL_CHECK(slots_[s], "stored reader: cannot allocate {} bytes of host staging", slot_bytes_);
    slot_pageable_[s] = 1;
}

void StoredReader::abort() {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    cv_.notify_all();
}

size_t StoredReader::bytes_read() const {
    std::lock_guard<std::mutex> lk(mu_);
    return bytes_;
}

size_t StoredReader::misses() const {
    std::lock_guard<std::mutex> lk(mu_);
    return misses_;
}

double StoredReader::reader_wait_seconds() const {
    std::lock_guard<std::mutex> lk(mu_);
    return reader_wait_;
}

double StoredReader::upload_wait_seconds() const {
    std::lock_guard<std::mutex> lk(mu_);
    return upload_wait_;
}

const StoredSlab& StoredReader::slab(const std::string& name) {
    std::lock_guard<std::mutex> lk(mu_);
    return slab_of(name);
}

const StoredSlab& StoredReader::slab_of(const std::string& name) {
    auto it = slabs_.find(name);
    if (it == slabs_.end()) it = slabs_.emplace(name, ck_.slab(name)).first;
    return it->second;
}

void StoredReader::copy_piece(const StoredSlab& sl, int64_t r0, int64_t r1, uint8_t* dst) const {
    const size_t wb = static_cast<size_t>((r1 - r0) * sl.row_bytes);
    std::memcpy(dst, sl.w + r0 * sl.row_bytes, wb);
    const auto [s0, s1] = sl.scale_rows(r0, r1);
    if (s1 > s0)
        std::memcpy(dst + align_up(wb), sl.s + s0 * sl.scale_row_bytes(),
                    static_cast<size_t>((s1 - s0) * sl.scale_row_bytes()));
}

void StoredReader::reader_loop() {
    for (;;) {
        std::unique_lock<std::mutex> lk(mu_);
        const auto ready = [&] {
            while (next_ < plan_.size() && plan_[next_].state == State::Skipped) ++next_;
            return stop_ || next_ >= plan_.size() || !free_slots_.empty();
        };
        timed_wait(cv_, lk, &reader_wait_, ready);
        if (stop_ || next_ >= plan_.size()) return;
        Entry& e = plan_[next_++];
        e.slot = free_slots_.back();
        free_slots_.pop_back();
        e.state = State::Reading;
        const StoredSlab& sl = slabs_.at(e.piece.name);
        const size_t n = piece_stored_bytes(sl, e.piece.r0, e.piece.r1);
        const int slot = e.slot;
        lk.unlock();
        if (!slots_[slot]) allocate_slot(slot);  // slots_[slot] is this thread's while it holds it
        copy_piece(sl, e.piece.r0, e.piece.r1, slots_[slot]);
        if (bar_) bar_->add(n);
        lk.lock();
        e.state = State::Ready;
        bytes_ += n;
        cv_.notify_all();
    }
}

void StoredReader::read_now(const StoredSlab& sl, int64_t r0, int64_t r1,
                            const std::function<void(const PieceBytes&)>& use) {
    const size_t n = piece_stored_bytes(sl, r0, r1);
    std::vector<uint8_t> own(piece_bytes(sl, r0, r1));
    copy_piece(sl, r0, r1, own.data());
    {
        std::lock_guard<std::mutex> lk(mu_);
        bytes_ += n;
        ++misses_;
    }
    if (bar_) bar_->add(n);
    const size_t wb = static_cast<size_t>((r1 - r0) * sl.row_bytes);
    use(PieceBytes{own.data(), sl.s ? own.data() + align_up(wb) : nullptr, r0, r1, false});
}

void StoredReader::read(const std::string& name, int64_t r0, int64_t r1,
                        const std::function<void(const PieceBytes&)>& use, bool defer) {
    std::unique_lock<std::mutex> lk(mu_);
    const StoredSlab& sl = slab_of(name);
    CPFILL_CHECK(0 <= r0 && r0 <= r1 && r1 <= sl.rows,
                 "stored reader: rows [{}, {}) of {}, which has {}", r0, r1, name, sl.rows);
    const std::vector<size_t>* planned = nullptr;
    if (auto it = by_name_.find(name); it != by_name_.end()) planned = &it->second;
    for (int64_t r = r0; r < r1;) {
        Entry* e = nullptr;
        if (planned)
            for (size_t i : *planned)
                if (plan_[i].piece.r0 <= r && r < plan_[i].piece.r1) {
                    e = &plan_[i];
                    break;
                }
        if (!e) {  // not foreseen: read on the spot
            const int64_t end = std::min(r1, r + rows_per_piece(sl, slot_bytes_));
            lk.unlock();
            read_now(sl, r, end, use);
            lk.lock();
            r = end;
            continue;
        }
        timed_wait(cv_, lk, &upload_wait_, [&] { return e->state != State::Reading; });
        if (e->state == State::Waiting) e->state = State::Skipped;  // the readers pass it
        const int64_t p0 = e->piece.r0, p1 = e->piece.r1;
        if (e->state != State::Ready) {
            lk.unlock();
            read_now(sl, p0, p1, use);
            lk.lock();
            r = p1;
            continue;
        }
        ++e->in_use;
        uint8_t* base = slots_[e->slot];
        const size_t wb = static_cast<size_t>((p1 - p0) * sl.row_bytes);
        const PieceBytes pb{base,
                            sl.s ? base + align_up(wb) : nullptr,
                            p0,
                            p1,
                            !slot_pageable_[e->slot],
                            e - plan_.data()};
        lk.unlock();
        try {
            use(pb);
        } catch (...) {
            lk.lock();
            release_locked(*e);  // whatever `use` queued is waited for by its caller's handler
            throw;
        }
        lk.lock();
        if (!defer) release_locked(*e);
        r = p1;
    }
}

void StoredReader::release(int64_t entry) {
    std::lock_guard<std::mutex> lk(mu_);
    release_locked(plan_.at(static_cast<size_t>(entry)));
}

void StoredReader::release_locked(Entry& e) {
    --e.in_use;
    ++e.released;
    if (e.released >= e.piece.users && e.in_use == 0 && e.state == State::Ready) {
        e.state = State::Done;
        free_slots_.push_back(e.slot);
        cv_.notify_all();
    }
}

}  // namespace cpfill::cuda
