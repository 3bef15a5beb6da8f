// Character-class table (from the generated runs in tokenizer_unicode_ranges.inc) and UTF-8
// validation/replacement for the tokenizer.
#include "io/tokenizer_unicode.h"

#include <map>
#include <vector>

namespace cpfill::tokenizer {

namespace {

struct Run {
    uint32_t first;  // first code point of the run; the run ends where the next one starts
    uint8_t cls;     // CharClass
};

constexpr Run kRuns[] = {
#include "io/tokenizer_unicode_ranges.inc"
};

// Length of the maximal well-formed prefix of a UTF-8 sequence at s[i] (1..4 when valid), or 0
// with `bad` set to the number of bytes of the maximal invalid subpart (WHATWG decoder, §4 of
// the Encoding Standard: a bad continuation byte is not consumed).
size_t utf8_sequence(std::string_view s, size_t i, size_t& bad) {
    const auto at = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
    const uint8_t c = at(i);
    size_t need = 0;
    uint8_t lower = 0x80, upper = 0xbf;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        need = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 2;
        if (c == 0xe0) lower = 0xa0;
        if (c == 0xed) upper = 0x9f;  // no surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 3;
        if (c == 0xf0) lower = 0x90;
        if (c == 0xf4) upper = 0x8f;  // nothing above U+10FFFF
    } else {
        bad = 1;
        return 0;
    }
    size_t j = i + 1;
    for (size_t k = 0; k < need; ++k, ++j) {
        if (j >= s.size() || at(j) < lower || at(j) > upper) {
            bad = j - i;
            return 0;
        }
        lower = 0x80;
        upper = 0xbf;
    }
    return need + 1;
}

}  // namespace

CharClassTable::CharClassTable() {
    constexpr size_t kRunCount = sizeof(kRuns) / sizeof(kRuns[0]);
    constexpr uint32_t kBlock = 1u << kShift;
    std::map<std::basic_string<uint8_t>, uint16_t> seen;
    std::basic_string<uint8_t> block(kBlock, 0);
    size_t run = 0;
    for (uint32_t start = 0; start < 0x110000; start += kBlock) {
        for (uint32_t k = 0; k < kBlock; ++k) {
            while (run + 1 < kRunCount && kRuns[run + 1].first <= start + k) ++run;
            block[k] = kRuns[run].cls;
        }
        auto [it, inserted] = seen.emplace(block, static_cast<uint16_t>(seen.size()));
        if (inserted) blocks_ += block;
        index_[start >> kShift] = it->second;
    }
}

const CharClassTable& CharClassTable::get() {
    static const CharClassTable table;
    return table;
}

bool is_valid_utf8(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        // ASCII fast path, 8 bytes at a time.
        while (i + 8 <= s.size()) {
            uint64_t w = 0;
            for (int k = 0; k < 8; ++k) w |= static_cast<uint64_t>(static_cast<uint8_t>(s[i + k]));
            if (w & 0x80) break;
            i += 8;
        }
        if (i >= s.size()) break;
        size_t bad = 0;
        const size_t n = utf8_sequence(s, i, bad);
        if (n == 0) return false;
        i += n;
    }
    return true;
}

std::string sanitize_utf8(std::string_view s) {
    std::string out;
    out.reserve(s.size() + 16);
    size_t i = 0;
    while (i < s.size()) {
        size_t bad = 0;
        const size_t n = utf8_sequence(s, i, bad);
        if (n > 0) {
            out.append(s.substr(i, n));
            i += n;
        } else {
            out.append("\xef\xbf\xbd");
            i += bad;
        }
    }
    return out;
}

}  // namespace cpfill::tokenizer
