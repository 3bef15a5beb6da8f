// Round-robin layout: local rows with padding, rank-major tokens, and the rerange inverse of an
// all-gather; chunking and the two-batch split.
#include <gtest/gtest.h>

#include "model/batch.h"
#include "parallel/layout.h"

namespace cpfill {
namespace {

TEST(Layout, RoundRobinWithPadding) {
    Batch b = make_batch({{10, 11, 12, 13, 14}, {20, 21}}, 100);  // 7 tokens
    CpLayout l = make_layout(b, 3);
    EXPECT_EQ(l.padded, 9);
    Rows r1 = l.local_rows(b, 1);  // global rows 1, 4, 7
    ASSERT_EQ(r1.n(), 3);
    EXPECT_EQ(r1.tokens, (std::vector<int32_t>{11, 14, 0}));
    EXPECT_EQ(r1.request, (std::vector<int32_t>{0, 0, 1}));
    EXPECT_EQ(r1.pos, (std::vector<int64_t>{1, 4, 2}));  // pad after request 1's last token
    EXPECT_EQ(r1.valid, (std::vector<uint8_t>{1, 1, 0}));
    EXPECT_EQ(l.rank_major_tokens(b), (std::vector<int32_t>{10, 13, 21, 11, 14, 0, 12, 20, 0}));
}

TEST(Layout, RerangeInvertsTheGather) {
    const int C = 3;
    const int64_t per = 3, width = 2, T = 8;
    std::vector<float> gathered(C * per * width);
    for (int k = 0; k < C; ++k)  // rank k's local row j holds token j·C + k
        for (int64_t j = 0; j < per; ++j)
            for (int64_t c = 0; c < width; ++c)
                gathered[(k * per + j) * width + c] = float((j * C + k) * 10 + c);
    std::vector<float> out(T * width);
    rerange(gathered.data(), C, per, width, T, out.data());
    for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < width; ++c) EXPECT_EQ(out[t * width + c], float(t * 10 + c));
}

TEST(Batch, ChunksContinueRequests) {
    std::vector<std::vector<int32_t>> reqs = {{1, 2, 3, 4, 5}, {6, 7, 8}};
    auto chunks = make_chunks(reqs, 3);
    ASSERT_EQ(chunks.size(), 3u);
    ASSERT_EQ(chunks[1].segments.size(), 2u);
    EXPECT_EQ(chunks[1].segments[0].request, 0);
    EXPECT_EQ(chunks[1].segments[0].pos0, 3);
    EXPECT_EQ(chunks[1].segments[1].request, 1);
    EXPECT_EQ(chunks[1].segments[1].pos0, 0);
    EXPECT_EQ(chunks[2].tokens, (std::vector<int32_t>{7, 8}));
    EXPECT_EQ(chunks[2].pos, (std::vector<int64_t>{1, 2}));
}

TEST(Batch, SplitInsideOrAtRequestBoundary) {
    auto [a, b] = split_in_two(make_batch({std::vector<int32_t>(10, 1)}, 5));
    EXPECT_EQ(a.n_tokens(), 5);
    EXPECT_EQ(b.segments[0].pos0, 5);  // second half continues the request
    auto [c, d] = split_in_two(make_batch({std::vector<int32_t>(9, 1), {2, 2, 2, 2, 2, 2, 2}}, 5));
    EXPECT_EQ(c.n_tokens(), 9);  // boundary at 9 is within 1/8 of the middle (8)
    EXPECT_EQ(d.segments[0].request, 1);
}

TEST(Batch, RejectsEmptyAndOutOfRange) {
    EXPECT_THROW(make_batch({{}}, 10), Error);
    EXPECT_THROW(make_batch({{1, 10}}, 10), Error);
    EXPECT_THROW(make_batch({}, 10), Error);
}

}  // namespace
}  // namespace cpfill
