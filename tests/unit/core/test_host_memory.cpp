// host_memory: MemAvailable and cgroup parsing, byte sizes, the CPFILL_HOST_MEMORY override.
#include <gtest/gtest.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/host_memory.h"

namespace cpfill {
namespace {

TEST(HostMemory, MemAvailableInBytes) {
    const std::string meminfo =
        "MemTotal:       32768000 kB\nMemFree:         1000 kB\nMemAvailable:   23644248 kB\n";
    EXPECT_EQ(meminfo_available(meminfo), size_t{23644248} * 1024);
    EXPECT_EQ(meminfo_available("MemTotal: 5 kB\n"), std::nullopt);
}

TEST(HostMemory, CgroupHeadroomCountsReclaimableCacheAsFree) {
    EXPECT_EQ(cgroup_headroom("max\n", "123\n", ""), std::nullopt);                // v2
    EXPECT_EQ(cgroup_headroom("9223372036854771712\n", "5\n", ""), std::nullopt);  // v1
    EXPECT_EQ(cgroup_headroom("1000\n", "400\n", "anon 300\nfile 100\n"), size_t{600});
    EXPECT_EQ(cgroup_headroom("1000\n", "400\n", "active_file 50\ninactive_file 100\n"),
              size_t{700});
    EXPECT_EQ(cgroup_headroom("1000\n", "400\n", "cache 9\ntotal_inactive_file 300\n"),
              size_t{900});
    EXPECT_EQ(cgroup_headroom("1000\n", "1200\n", ""), size_t{0});  // over the limit
}

TEST(HostMemory, ByteSizes) {
    EXPECT_EQ(parse_byte_size("68719476736", "x"), size_t{68719476736});
    EXPECT_EQ(parse_byte_size("64G", "x"), size_t{64} << 30);
    EXPECT_EQ(parse_byte_size("64GiB", "x"), size_t{64} << 30);
    EXPECT_EQ(parse_byte_size("1.5T", "x"), size_t{3} << 39);
    EXPECT_EQ(parse_byte_size("512k", "x"), size_t{512} << 10);
    for (const char* bad : {"", "G", "-1G", "12Q", "1e30", "nan", "64 G"}) {
        SCOPED_TRACE(bad);
        try {
            parse_byte_size(bad, "CPFILL_HOST_MEMORY");
            ADD_FAILURE() << "accepted";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("CPFILL_HOST_MEMORY"), std::string::npos);
            EXPECT_NE(std::string(e.what()).find("64G"), std::string::npos);
        }
    }
}

TEST(HostMemory, OverrideAndDetection) {
    ASSERT_EQ(::setenv("CPFILL_HOST_MEMORY", "3G", 1), 0);
    auto m = host_memory_available();
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->available, size_t{3} << 30);
    EXPECT_EQ(m->source, "CPFILL_HOST_MEMORY");
    ASSERT_EQ(::unsetenv("CPFILL_HOST_MEMORY"), 0);
    // On Linux /proc/meminfo is always there: some memory is available to this test.
    m = host_memory_available();
    ASSERT_TRUE(m.has_value());
    EXPECT_GT(m->available, size_t{0});
    EXPECT_FALSE(m->source.empty());
}

}  // namespace
}  // namespace cpfill
