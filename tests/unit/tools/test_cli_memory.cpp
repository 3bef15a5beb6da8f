// The CPU backend's memory check: cpu_prefill_bytes against the peak RSS that `run --json` reports
// (its growth between two prompt lengths, so that the process's fixed part cancels), and the
// refusal of a prompt that does not fit, with a --chunk that does.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../io/io_test_util.h"
#include "cli_test_util.h"
#include "io/checkpoint.h"
#include "parallel/cp_prefill.h"

namespace cpfill {
namespace {

using test::run_cli;
using test::TempDir;

struct Model {
    TempDir dir;
    std::string path = dir.file("m");
    Model() {
        const auto r = run_cli("gen-model --preset tiny --seed 5 --out " + path);
        EXPECT_EQ(r.code, 0) << r.out;
    }
    std::string ids_file(int64_t n) const {
        const std::string f = dir.file("ids" + std::to_string(n) + ".txt");
        std::ofstream out(f);
        for (int64_t i = 0; i < n; ++i) out << (i * 7919 + 13) % 500 + 1 << ' ';
        return f;
    }
};

size_t estimate(const ModelConfig& cfg, int64_t n, int cp, int64_t chunk = 0) {
    PrefillOptions p;
    p.cp = cp;
    p.chunk = chunk;
    return cpu_prefill_bytes(cfg, {std::vector<int32_t>(static_cast<size_t>(n), 1)}, p);
}

TEST(CliMemory, CpuEstimateFollowsTheMeasuredGrowth) {
    const Model m;
    const ModelConfig cfg = Checkpoint(m.path).config();
    for (int cp : {1, 2}) {
        SCOPED_TRACE("cp " + std::to_string(cp));
        double peak[2];
        const int64_t lengths[2] = {1024, 4096};
        for (int i = 0; i < 2; ++i) {
            const auto r =
                run_cli("run --model " + m.path + " --input-ids-file " + m.ids_file(lengths[i]) +
                        " --tbo off --json --cp " + std::to_string(cp));
            ASSERT_EQ(r.code, 0) << r.out;
            const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
            peak[i] = j.at("memory").at("peak_rss_bytes").get<double>();
        }
        const double measured = peak[1] - peak[0];
        const double predicted =
            double(estimate(cfg, lengths[1], cp)) - double(estimate(cfg, lengths[0], cp));
        EXPECT_GT(measured, 0.75 * predicted)
            << "measured " << measured << " predicted " << predicted;
        EXPECT_LT(measured, 1.35 * predicted)
            << "measured " << measured << " predicted " << predicted;
    }
    // More ranks hold more (each its own gathered rows and KV store); chunks hold less.
    EXPECT_GT(estimate(cfg, 4096, 2), estimate(cfg, 4096, 1));
    EXPECT_LT(estimate(cfg, 4096, 1, 1024), estimate(cfg, 4096, 1));
}

TEST(CliMemory, PromptThatDoesNotFitIsRefusedWithAChunkThatFits) {
    const Model m;
    const ModelConfig cfg = Checkpoint(m.path).config();
    const std::string ids = m.ids_file(4096);
    // Room for chunks of 1024 with the check's 15% margin, not for chunks of 2048.
    const size_t room = size_t(1.15 * double(estimate(cfg, 4096, 1, 1024))) + (size_t{1} << 20);
    ASSERT_LT(room, size_t(1.15 * double(estimate(cfg, 4096, 1, 2048))));
    ASSERT_EQ(::setenv("CPFILL_HOST_MEMORY", std::to_string(room).c_str(), 1), 0);
    const auto refused = run_cli("run --model " + m.path + " --input-ids-file " + ids);
    const auto chunked =
        run_cli("run --model " + m.path + " --input-ids-file " + ids + " --chunk 1024");
    ASSERT_EQ(::unsetenv("CPFILL_HOST_MEMORY"), 0);
    EXPECT_EQ(refused.code, 1) << refused.out;
    for (const char* part : {"out of host memory", "4096 tokens at --cp 1", "CPFILL_HOST_MEMORY",
                             "--chunk 1024 would fit"})
        EXPECT_NE(refused.out.find(part), std::string::npos) << part << "\n" << refused.out;
    EXPECT_EQ(chunked.code, 0) << chunked.out;
}

}  // namespace
}  // namespace cpfill
