// json_excerpt: the printable, bounded excerpt of untrusted JSON used in error messages.
#include <gtest/gtest.h>

#include <string>

#include "io/json_excerpt.h"

namespace cpfill {
namespace {

using json = nlohmann::json;

// True when `s` is well-formed UTF-8 (no truncated or stray continuation bytes).
bool valid_utf8(const std::string& s) {
    size_t i = 0;
    while (i < s.size()) {
        const auto c = static_cast<unsigned char>(s[i]);
        const size_t n = c < 0x80             ? 1
                         : (c & 0xE0) == 0xC0 ? 2
                         : (c & 0xF0) == 0xE0 ? 3
                         : (c & 0xF8) == 0xF0 ? 4
                                              : 0;
        if (n == 0 || i + n > s.size()) return false;
        for (size_t k = 1; k < n; ++k)
            if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
        i += n;
    }
    return true;
}

TEST(JsonExcerpt, ShortValuesAreWrittenWhole) {
    EXPECT_EQ(json_excerpt(json(3)), "3");
    EXPECT_EQ(json_excerpt(json("ab")), "\"ab\"");
    EXPECT_EQ(json_excerpt(json::parse(R"({"a":[1,2],"b":null})")), R"({"a":[1,2],"b":null})");
}

TEST(JsonExcerpt, LongValuesAreCutWithAnEllipsis) {
    const std::string out = json_excerpt(json(std::string(200, 'x')), 20);
    EXPECT_EQ(out, "\"" + std::string(19, 'x') + "...");
    const std::string arr = json_excerpt(json(std::vector<int>(1000, 7)), 30);
    EXPECT_EQ(arr.size(), 33u);
    EXPECT_EQ(arr.substr(0, 4), "[7,7");
}

TEST(JsonExcerpt, CutsOnlyBetweenCharacters) {
    // "é" (2 bytes), "€" (3 bytes) and "𝄞" (4 bytes) placed across every cut position.
    for (const std::string ch : {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9d\x84\x9e"}) {
        for (size_t pad = 0; pad < 8; ++pad) {
            std::string s = std::string(pad, 'a');
            for (int i = 0; i < 10; ++i) s += ch;
            const std::string out = json_excerpt(json(s), 10);
            EXPECT_TRUE(valid_utf8(out)) << "pad " << pad << ": " << out;
            EXPECT_LE(out.size(), 13u);
            EXPECT_EQ(out.substr(out.size() - 3), "...");
        }
    }
}

TEST(JsonExcerpt, InvalidUtf8IsReplacedNotThrown) {
    std::string out;
    EXPECT_NO_THROW(out = json_excerpt(json(std::string("a\xff\xc3z"))));
    EXPECT_TRUE(valid_utf8(out)) << out;
    EXPECT_NE(out.find("\xef\xbf\xbd"), std::string::npos) << out;  // U+FFFD
    EXPECT_NO_THROW(out = json_excerpt(json{{std::string("k\xfe"), 1}}));
    EXPECT_TRUE(valid_utf8(out)) << out;
}

TEST(JsonExcerpt, DeepNestingStopsAtTheBudget) {
    // Deep enough that an unbounded recursive dump would exhaust the stack of a test thread.
    const size_t depth = 200000;
    const json deep = json::parse(std::string(depth, '[') + std::string(depth, ']'));
    const std::string out = json_excerpt(deep, 16);
    EXPECT_EQ(out, std::string(16, '[') + "...");
}

}  // namespace
}  // namespace cpfill
