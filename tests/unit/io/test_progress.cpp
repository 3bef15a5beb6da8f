// The progress line's content, and that a Progress counts from several threads and stays silent
// when stderr is not a terminal (as under ctest).
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "io/progress.h"

namespace cpfill {
namespace {

TEST(Progress, LineShowsBytesRateAndEta) {
    const std::string l = progress_line("loading", 1'000'000'000, 4'000'000'000, 2.0);
    EXPECT_NE(l.find("loading"), std::string::npos) << l;
    EXPECT_NE(l.find("1.00 / 4.00 GB"), std::string::npos) << l;
    EXPECT_NE(l.find(" 25%"), std::string::npos) << l;
    EXPECT_NE(l.find("0.50 GB/s"), std::string::npos) << l;
    EXPECT_NE(l.find("ETA 6 s"), std::string::npos) << l;
    EXPECT_NE(l.find("[######------"), std::string::npos) << l;
    const std::string done = progress_line("loading", 4'000'000'000, 4'000'000'000, 8.0);
    EXPECT_NE(done.find("100%"), std::string::npos) << done;
    EXPECT_NE(done.find("in 8.0 s"), std::string::npos) << done;
    EXPECT_NO_THROW(progress_line("x", 0, 0, 0.0));
}

TEST(Progress, ThreadSafeAndSilentWithoutTerminal) {
    testing::internal::CaptureStderr();
    {
        Progress p("loading", 4 * 1000, true);
        std::vector<std::thread> ts;
        for (int t = 0; t < 4; ++t)
            ts.emplace_back([&] {
                for (int i = 0; i < 1000; ++i) p.add(1);
            });
        for (auto& t : ts) t.join();
        p.finish();
    }
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace cpfill
