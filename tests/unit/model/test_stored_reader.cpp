// StoredReader (model/cuda/stored_reader.h), the GPU upload's read-ahead, on its own: its threads,
// slots and hand-over need no GPU (without one its slots are plain memory), so it runs here. Every
// piece handed out holds exactly the checkpoint's stored bytes of its rows and scale rows, whether
// it came through the ring or was read on the spot; several readers of the same pieces, requests
// out of the plan's order (they cannot wait for the ring: the reader reads them itself), requests
// the plan did not foresee and reads after abort() all end with the right bytes.
#ifdef CPFILL_HAVE_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "../io/io_test_util.h"
#include "io/checkpoint.h"
#include "io/presets.h"
#include "io/random_checkpoint.h"
#include "model/cuda/stored_reader.h"

namespace cpfill {
namespace {

using cuda::PieceBytes;
using cuda::StoredPiece;
using cuda::StoredPlan;
using cuda::StoredReader;

const std::string& checkpoint() {
    static test::TempDir dir;
    static const std::string path = [] {
        RandomCheckpointOptions o;
        o.seed = 4;
        o.names = "upstream";
        o.dtype = "fp8";
        o.experts = "fp4";
        o.threads = 2;
        write_random_checkpoint(preset_config("tiny"), dir.path().string(), o);
        return dir.path().string();
    }();
    return path;
}

// Every weight of layer 1 (fp8 linears, fp4 experts, bf16 / f32 tensors) whole, in pieces of at
// most `piece` bytes, each to be read by `users` readers.
StoredPlan plan_of(const Checkpoint& ck, size_t piece, int users) {
    StoredPlan p;
    for (const WeightSpec& s : ck.specs().all()) {
        if (s.layer != 1 || s.cls == WeightClass::I64) continue;
        const StoredSlab sl = ck.slab(s.name);
        const int64_t step = cuda::rows_per_piece(sl, piece);
        for (int64_t r = 0; r < sl.rows; r += step) {
            const int64_t e = std::min(sl.rows, r + step);
            p.pieces.push_back(StoredPiece{s.name, r, e, users});
            p.max_piece_bytes = std::max(p.max_piece_bytes, cuda::piece_bytes(sl, r, e));
        }
        p.slabs.emplace(s.name, sl);
    }
    return p;
}

// Reads rows [0, rows) of `name` through rd and checks every piece's bytes against the mapping;
// returns the rows seen.
int64_t read_and_check(StoredReader& rd, const Checkpoint& ck, const std::string& name) {
    const StoredSlab sl = ck.slab(name);
    int64_t next = 0;
    rd.read(name, 0, sl.rows, [&](const PieceBytes& p) {
        EXPECT_EQ(p.r0, next) << name;
        ASSERT_LT(p.r0, p.r1) << name;
        next = p.r1;
        EXPECT_EQ(std::memcmp(p.w, sl.w + p.r0 * sl.row_bytes, (p.r1 - p.r0) * sl.row_bytes), 0)
            << name << " rows [" << p.r0 << ", " << p.r1 << ")";
        if (sl.s) {
            const auto [s0, s1] = sl.scale_rows(p.r0, p.r1);
            ASSERT_NE(p.s, nullptr) << name;
            EXPECT_EQ(std::memcmp(p.s, sl.s + s0 * sl.scale_row_bytes(),
                                  (s1 - s0) * sl.scale_row_bytes()),
                      0)
                << name << " scales of rows [" << p.r0 << ", " << p.r1 << ")";
        }
    });
    return next;
}

std::vector<std::string> names_of(const StoredPlan& p) {
    std::vector<std::string> n;
    for (const StoredPiece& piece : p.pieces)
        if (n.empty() || n.back() != piece.name) n.push_back(piece.name);
    return n;
}

TEST(StoredReader, ThreeReadersInPlanOrderGetTheStoredBytes) {
    const Checkpoint ck(checkpoint());
    StoredPlan plan = plan_of(ck, size_t{1} << 16, 3);  // small pieces: rows split, the ring wraps
    const std::vector<std::string> names = names_of(plan);
    StoredReader rd(ck, std::move(plan), 2, 3, nullptr);
    std::vector<std::thread> readers;
    for (int t = 0; t < 3; ++t)
        readers.emplace_back([&] {
            for (const std::string& n : names)
                EXPECT_EQ(read_and_check(rd, ck, n), ck.slab(n).rows) << n;
        });
    for (std::thread& t : readers) t.join();
    size_t stored = 0;
    for (const std::string& n : names) stored += ck.stored(n).bytes;
    // Every piece read once through the ring, or again by each reader that found it not read yet.
    EXPECT_GE(rd.bytes_read(), stored);
    EXPECT_LE(rd.bytes_read(), 3 * stored);
}

TEST(StoredReader, RequestsOutOfOrderOrUnplannedAreReadOnTheSpot) {
    const Checkpoint ck(checkpoint());
    StoredPlan plan = plan_of(ck, size_t{1} << 16, 1);
    std::vector<std::string> names = names_of(plan);
    StoredReader rd(ck, std::move(plan), 1, 2, nullptr);
    std::reverse(names.begin(), names.end());  // the ring fills from the front: the last first
    for (const std::string& n : names) EXPECT_EQ(read_and_check(rd, ck, n), ck.slab(n).rows) << n;
    EXPECT_GT(rd.misses(), 0u);
    // Not in the plan (layer 0): read on the spot.
    const std::string other = "layers.0.attn.wq_a.weight";
    const size_t misses = rd.misses();
    EXPECT_EQ(read_and_check(rd, ck, other), ck.slab(other).rows);
    EXPECT_GT(rd.misses(), misses);
}

TEST(StoredReader, ReadsAfterAbortStillGetTheBytes) {
    const Checkpoint ck(checkpoint());
    StoredPlan plan = plan_of(ck, size_t{1} << 16, 1);
    const std::vector<std::string> names = names_of(plan);
    StoredReader rd(ck, std::move(plan), 2, 2, nullptr);
    rd.abort();
    for (const std::string& n : names) EXPECT_EQ(read_and_check(rd, ck, n), ck.slab(n).rows) << n;
}

TEST(StoredReader, DeferredReleaseHoldsTheSlotUntilReleased) {
    const Checkpoint ck(checkpoint());
    StoredPlan plan = plan_of(ck, size_t{1} << 16, 1);
    const std::vector<std::string> names = names_of(plan);
    StoredReader rd(ck, std::move(plan), 1, 3, nullptr);
    // Hold the first weight's ring pieces, read everything else (which must then come through the
    // remaining slots or on the spot), release, and the held bytes are still the stored ones.
    const StoredSlab first = ck.slab(names[0]);
    std::vector<std::pair<PieceBytes, std::vector<uint8_t>>> held;
    rd.read(
        names[0], 0, first.rows,
        [&](const PieceBytes& p) {
            held.emplace_back(p, std::vector<uint8_t>(p.w, p.w + (p.r1 - p.r0) * first.row_bytes));
        },
        true);
    for (size_t i = 1; i < names.size(); ++i)
        EXPECT_EQ(read_and_check(rd, ck, names[i]), ck.slab(names[i]).rows) << names[i];
    for (const auto& [p, copy] : held) {
        if (p.entry < 0) continue;  // read on the spot: nothing held
        EXPECT_EQ(std::memcmp(p.w, copy.data(), copy.size()), 0) << "a held slot was reused";
        rd.release(p.entry);
    }
}

}  // namespace
}  // namespace cpfill
#endif
