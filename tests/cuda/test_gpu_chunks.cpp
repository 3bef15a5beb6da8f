// Chunked prefill on GPUs (GpuRunOptions::chunk, docs/parallel.md "Chunked prefill on GPUs")
// against one pass of the same requests on the same GPU: logits and records of every row, the KV
// state, the HF reference, and the automatic chunking of a batch whose one pass does not fit.
//
// Chunks run the GEMMs on other row counts, so the values differ by bf16 rounding, and the
// fixtures' router margins (4e-5 … 1e-3 relative) are below bf16's resolution: a token may pick
// another expert in one of the runs (test_gpu_prefill.cpp). So the rule is per row: a row whose
// router and indexer choices agree in every layer must be within 2e-2 of the tensor's max-abs
// value; rows whose choices differ may be off (at most 10% of them), and their count is printed.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "cuda_test_util.h"
#include "gpu_fixture.h"
#include "io/presets.h"
#include "model/batch.h"
#include "parallel/gpu_prefill.h"

namespace cpfill {
namespace {

using namespace gpu_test;
using testing::golden_fixtures;

struct ChunkRun {
    PrefillOutput out;
    GpuStats stats;
};

ChunkRun run_chunked(GpuGroup& g, const std::vector<std::vector<int32_t>>& requests, int64_t chunk,
                     TboMode tbo, size_t workspace_limit = 0) {
    GpuRunOptions o;
    o.tbo = tbo;
    o.chunk = chunk;
    o.all_logits = true;
    o.record_hidden = o.record_topk = o.record_kv = true;
    o.workspace_limit = workspace_limit;
    ChunkRun r;
    r.out = g.run(requests, o, &r.stats);
    return r;
}

std::set<int32_t> row_set(const Tensor& t, int64_t row) {
    const int64_t k = t.dim(1);
    std::set<int32_t> s;
    for (int64_t j = 0; j < k; ++j)
        if (t.data<int32_t>()[row * k + j] >= 0) s.insert(t.data<int32_t>()[row * k + j]);
    return s;
}

// Per row of the token stream: whether both runs chose the same experts and (CSA) the same
// indexer entries in every layer.
std::vector<bool> same_choices(const PrefillOutput& a, const PrefillOutput& b, int64_t rows,
                               const std::string& what) {
    std::vector<bool> same(rows, true);
    for (size_t li = 0; li < a.routes.size(); ++li) {
        int64_t routes = 0, entries = 0;
        for (int64_t t = 0; t < rows; ++t) {
            if (row_set(a.routes[li], t) != row_set(b.routes[li], t)) {
                same[t] = false;
                ++routes;
            }
            if (a.topk[li].ndim() == 2 && row_set(a.topk[li], t) != row_set(b.topk[li], t)) {
                same[t] = false;
                ++entries;
            }
        }
        if (routes + entries > 0)
            std::printf(
                "[ chunks ] %s layer %zu: %lld rows route otherwise, %lld select other "
                "indexer entries\n",
                what.c_str(), li, static_cast<long long>(routes), static_cast<long long>(entries));
    }
    return same;
}

// Rows [row0, row0 + n) of f32 [rows, …] tensors: each row whose choices agree within tol of
// b's max-abs value; at most 10% of rows with other choices (unless !bound_differ: rows of the KV
// state, whose tokens' choices the logits and hidden states already bound).
void expect_rows_close(const std::string& what, const float* a, const float* b, int64_t n,
                       int64_t width, const std::vector<bool>& same, int64_t same0,
                       bool bound_differ = true) {
    double ref_max = 0;
    for (int64_t i = 0; i < n * width; ++i) ref_max = std::max(ref_max, double(std::fabs(b[i])));
    int64_t bad = 0, differ = 0;
    double worst = 0;
    for (int64_t t = 0; t < n; ++t) {
        double e = 0;
        for (int64_t j = 0; j < width; ++j)
            e = std::max(e, double(std::fabs(a[t * width + j] - b[t * width + j])));
        ASSERT_TRUE(std::isfinite(e)) << what << ": row " << t << " not finite";
        if (!same[same0 + t]) {
            ++differ;
            continue;
        }
        worst = std::max(worst, e);
        if (e > kTolerance * ref_max) ++bad;
    }
    std::printf(
        "[ chunks ] %s: %lld rows, %lld with other choices; the others max abs %.3g of %.3g\n",
        what.c_str(), static_cast<long long>(n), static_cast<long long>(differ), worst, ref_max);
    EXPECT_EQ(bad, 0) << what << ": " << bad << " rows with the same choices off by more than "
                      << kTolerance << " of " << ref_max;
    if (bound_differ) {
        EXPECT_LE(differ, n / 10) << what << ": " << differ << " of " << n
                                  << " rows chose otherwise";
    }
}

// Returns which rows of the stream made the same choices in both runs.
std::vector<bool> expect_equal_runs(const ChunkRun& chunked, const ChunkRun& one,
                                    const std::string& what) {
    const PrefillOutput &c = chunked.out, &o = one.out;
    const int64_t T = o.n_tokens;
    EXPECT_EQ(c.n_tokens, T);
    if (c.n_tokens != T) return {};
    const std::vector<bool> same = same_choices(c, o, T, what);
    int64_t row0 = 0;
    for (size_t r = 0; r < o.logits.size(); ++r) {
        const int64_t len = o.logits[r].dim(0), V = o.logits[r].dim(1);
        expect_rows_close(fmt::format("{} logits of request {}", what, r), c.logits[r].f32(),
                          o.logits[r].f32(), len, V, same, row0);
        EXPECT_EQ(last_argmax(c.logits[r]), last_argmax(o.logits[r])) << what << " request " << r;
        row0 += len;
    }
    // The records land on their rows of the stream: the final hidden state of every row.
    const Tensor &hc = c.hidden.back(), &ho = o.hidden.back();
    expect_rows_close(what + " final hidden state", hc.f32(), ho.f32(), T, ho.dim(1), same, 0);
    return same;
}

// The KV state after the last chunk (KvStore, as --kv-out writes it) equals one pass's: the same
// counts, and the values close. In layers whose inputs passed a learned router, rows whose tokens
// chose otherwise (same: rows of the stream, requests in order) are left out: a window key is its
// token's, an entry pools its window and the one before (CSA's overlap), a tail row its token's.
void expect_same_kv(const KvStore& c, const KvStore& o, const ModelConfig& cfg,
                    const std::vector<bool>& same, const std::string& what) {
    ASSERT_EQ(c.size(), o.size());
    int first_learned = cfg.n_layers;
    for (int li = 0; li < cfg.n_layers; ++li)
        if (cfg.mlp_types[li] == MlpType::Learned) first_learned = std::min(first_learned, li);
    int64_t row0 = 0;  // the request's first row of the stream
    for (size_t r = 0; r < o.size(); ++r) {
        const int64_t n_tokens = o[r].empty() ? 0 : o[r][0].n_tokens;
        ASSERT_LE(row0 + n_tokens, static_cast<int64_t>(same.size())) << what;
        for (int li = 0; li < cfg.n_layers; ++li) {
            const LayerKv &a = c[r][li], &b = o[r][li];
            const std::string at = fmt::format("{} request {} layer {}", what, r, li);
            EXPECT_EQ(a.n_tokens, b.n_tokens) << at;
            EXPECT_EQ(a.window0, b.window0) << at;
            EXPECT_EQ(a.n_entries, b.n_entries) << at;
            EXPECT_EQ(a.main_tail.pos0, b.main_tail.pos0) << at;
            // Whether the tokens at positions [p0, p1) chose alike (always before a learned
            // router).
            const bool routed = li > first_learned;
            const auto agree = [&](int64_t p0, int64_t p1) {
                for (int64_t p = std::max<int64_t>(p0, 0); routed && p < p1; ++p)
                    if (!same[row0 + p]) return false;
                return true;
            };
            // rows × width values; row i covers the positions span(i).
            const auto check = [&](const std::string& name, const std::vector<float>& va,
                                   const std::vector<float>& vb, int64_t rows, auto span) {
                ASSERT_EQ(va.size(), vb.size()) << at << " " << name;
                if (vb.empty() || rows == 0) return;
                std::vector<bool> mask(rows);
                for (int64_t i = 0; i < rows; ++i) {
                    const auto [p0, p1] = span(i);
                    mask[i] = agree(p0, p1);
                }
                expect_rows_close(at + " " + name, va.data(), vb.data(), rows,
                                  static_cast<int64_t>(vb.size()) / rows, mask, 0, false);
            };
            const int64_t ratio = cfg.ratio(li);
            const auto position = [](int64_t p0) {
                return [p0](int64_t i) { return std::pair{p0 + i, p0 + i + 1}; };
            };
            const auto entry = [ratio](int64_t e) {
                return std::pair{(e - 1) * ratio, (e + 1) * ratio};
            };
            check("window", a.window, b.window, b.n_tokens - b.window0, position(b.window0));
            check("entries", a.entries, b.entries, b.n_entries, entry);
            check("index keys", a.index_keys, b.index_keys, b.n_entries, entry);
            const int64_t main_rows = b.n_tokens - b.main_tail.pos0;
            check("compressor tail", a.main_tail.kv, b.main_tail.kv, main_rows,
                  position(b.main_tail.pos0));
            check("compressor gate tail", a.main_tail.gate, b.main_tail.gate, main_rows,
                  position(b.main_tail.pos0));
            check("indexer tail", a.index_tail.kv, b.index_tail.kv, b.n_tokens - b.index_tail.pos0,
                  position(b.index_tail.pos0));
        }
        row0 += n_tokens;
    }
}

// Chunks bound the activations and the window keys: a chunked plan needs less than one pass, less
// for smaller chunks; a longer prompt in the same chunks adds its compressed entries (and indexer
// keys), not its window keys (a buffer of the chunk and the window before it).
TEST(GpuChunks, ShrinkTheWorkspaceAndBoundTheWindowKeys) {
    CPFILL_SKIP_WITHOUT_GPU();
    const ModelConfig cfg = preset_config("flash-slice");
    const auto ws = [&](int64_t tokens, int64_t chunk) {
        return plan_gpu_memory(cfg, tokens, 1, 1, false, false, GpuWeightFormat::Bf16, chunk)
            .workspace;
    };
    const size_t one = ws(65536, 0), c16 = ws(65536, 16384), c4 = ws(65536, 4096);
    EXPECT_LT(c16, one);
    EXPECT_LT(c4, c16);
    const int64_t more = 65536;
    size_t entries = 0;
    for (int li = 0; li < cfg.n_layers; ++li) {
        const int ratio = cfg.ratio(li);
        if (ratio == 0) continue;
        entries += size_t(more / ratio) * cfg.head_dim * 2;
        if (cfg.layer_types[li] == AttnType::CSA)
            entries += size_t(more / ratio) * cfg.index_head_dim * 2;
    }
    const size_t longer = ws(65536 + more, 4096);
    EXPECT_GE(longer - c4, entries);
    // Less than one layer's window keys of the added tokens (all layers' were 4 × 64 MiB here).
    EXPECT_LT(longer - c4, entries + size_t(more) * cfg.head_dim * 2);
    // And one chunk as large as the prompt is one pass.
    EXPECT_EQ(ws(65536, 65536), one);
}

// Chunk sizes that cut HCA windows (128) and CSA windows (4) anywhere, down to one token, with
// and without two-batch overlap inside each chunk.
TEST(GpuChunks, EqualOnePassOnEveryRow) {
    CPFILL_SKIP_WITHOUT_GPU();
    for (const std::string& dir : golden_fixtures()) {
        Fixture f = load_fixture(dir, 1);
        GpuGroupOptions go;
        GpuGroup g(go);
        upload(g, f);
        const ChunkRun one = run_chunked(g, f.requests, 0, TboMode::Off);
        EXPECT_EQ(one.out.chunk, 0);
        for (int64_t chunk : {200, 130, 37, 5, 1})
            for (TboMode tbo : {TboMode::Off, TboMode::On}) {
                if (chunk == 1 && tbo == TboMode::On) continue;  // nothing to split
                const ChunkRun c = run_chunked(g, f.requests, chunk, tbo);
                const std::string what = fmt::format("{} --chunk {} TBO {}", dir, chunk,
                                                     tbo == TboMode::On ? "on" : "off");
                EXPECT_EQ(c.out.chunk, chunk) << what;
                EXPECT_EQ(c.stats.chunk, chunk) << what;
                const std::vector<bool> same = expect_equal_runs(c, one, what);
                expect_same_kv(c.out.kv, one.out.kv, f.cfg, same, what);
            }
    }
}

// Chunked runs as close to HF float32 as one pass is (test_gpu_prefill.cpp, GpuGolden).
TEST(GpuChunks, MatchHf) {
    CPFILL_SKIP_WITHOUT_GPU();
    for (const std::string& dir : golden_fixtures()) {
        Fixture f = load_fixture(dir, 1);
        GpuGroupOptions go;
        GpuGroup g(go);
        upload(g, f);
        const ChunkRun c = run_chunked(g, f.requests, 64, TboMode::On);
        for (size_t r = 0; r < f.requests.size(); ++r) {
            const std::string sfx = f.suffix(static_cast<int>(r));
            EXPECT_TRUE(close(fmt::format("{} --chunk 64 logits{} vs HF", dir, sfx),
                              c.out.logits[r], f.ref->get("logits" + sfx), kTolerance));
            EXPECT_EQ(last_argmax(c.out.logits[r]), last_argmax(f.ref->get("logits" + sfx)));
        }
    }
}

// A small model with ≥ 16 indexer heads (docs: with 4 the top-k boundary is a tie) whose
// indexer keeps every entry of these prompts (712 per request): on random weights the scores of
// ~700 entries lie so close that bf16 rounding alone moves the top 16 — measured on the H200, one
// pass with TBO on against off picked other entries for 1370 of 5700 rows — so a top-k smaller
// than the entries would test the weights' ties, not the chunks (the golden fixtures select).
ModelConfig chunk_config() {
    ModelConfig cfg = preset_config("tiny");
    cfg.index_n_heads = 16;
    cfg.index_topk = 1024;
    return cfg;
}

// Two requests of 2850 tokens (the split plan_gpu_memory plans for 5700 tokens in 2).
std::vector<std::vector<int32_t>> long_requests(const ModelConfig& cfg) {
    std::vector<std::vector<int32_t>> req(2);
    for (int64_t i = 0; i < 2850; ++i) {
        req[0].push_back(static_cast<int32_t>((i * 7919) % cfg.vocab_size));
        req[1].push_back(static_cast<int32_t>((i * 104729 + 13) % cfg.vocab_size));
    }
    return req;
}

// Without --chunk, a batch whose one pass does not fit the workspace runs in the largest
// power-of-two chunks that do; an explicit --chunk that does not fit is an error naming one that
// does; and one that nothing fits names the memory.
TEST(GpuChunks, BatchOverTheWorkspaceRunsInChunks) {
    CPFILL_SKIP_WITHOUT_GPU();
    const ModelConfig cfg = chunk_config();
    const auto req = long_requests(cfg);
    GpuGroupOptions go;
    GpuGroup g(go);
    g.randomize(cfg, 5);
    const int64_t T = 5700;
    const size_t whole = plan_gpu_memory(cfg, T, 2, 1, false, true).workspace;
    const size_t in_2048 =
        plan_gpu_memory(cfg, T, 2, 1, false, true, GpuWeightFormat::Bf16, 2048).workspace;
    const size_t in_4096 =
        plan_gpu_memory(cfg, T, 2, 1, false, true, GpuWeightFormat::Bf16, 4096).workspace;
    ASSERT_LT(in_2048, in_4096);
    ASSERT_LT(in_4096, whole);
    const size_t limit = (in_2048 + in_4096) / 2;  // 2048 fits, 4096 and one pass do not

    const ChunkRun one = run_chunked(g, req, 0, TboMode::Off);
    const ChunkRun autoc = run_chunked(g, req, 0, TboMode::Off, limit);
    EXPECT_EQ(autoc.out.chunk, 2048);
    const std::vector<bool> same = expect_equal_runs(autoc, one, "automatic chunks");
    expect_same_kv(autoc.out.kv, one.out.kv, cfg, same, "automatic chunks");

    try {
        run_chunked(g, req, 4096, TboMode::Off, limit);
        FAIL() << "expected out of GPU memory at --chunk 4096";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("out of GPU memory"), std::string::npos) << m;
        EXPECT_NE(m.find("--chunk 2048 would fit"), std::string::npos) << m;
    }
    try {
        run_chunked(g, req, 0, TboMode::Off, size_t{1} << 20);
        FAIL() << "expected out of GPU memory with 1 MiB";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("out of GPU memory"), std::string::npos) << m;
        EXPECT_NE(m.find("in chunks of 1024"), std::string::npos) << m;
    }
    // The group still runs after the refusals.
    const ChunkRun after = run_chunked(g, req, 1000, TboMode::On);
    const std::vector<bool> same_after =
        expect_equal_runs(after, one, "--chunk 1000 after the refusals");
    expect_same_kv(after.out.kv, one.out.kv, cfg, same_after, "--chunk 1000");
}

}  // namespace
}  // namespace cpfill
