// The pre-tokenizer's Split regexes, hand-written. No std::regex supports \p{..} classes, so each
// regex that a supported tokenizer.json uses is recognised by its exact text and matched by code
// that follows JavaScript's backtracking semantics (the reference, @lenml/tokenizers, runs the
// regexes with the `u` flag): alternatives tried in order, quantifiers greedy with backtracking,
// matching over code points, the piece being split taken as the whole input (so (?!\S) sees its
// end). Any other regex is refused at load time with the list of supported ones.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer_unicode.h"

namespace cpfill::tokenizer {

// UTF-8 text decoded once per encode: per code point its value and class, and byte offsets.
class DecodedText {
  public:
    // `utf8` must be well-formed (see sanitize_utf8) and shorter than 4 GiB.
    void assign(std::string_view utf8);

    size_t size() const { return chars_.size(); }
    uint32_t cp(size_t i) const { return chars_[i] & 0xffffff; }
    CharClass cls(size_t i) const { return static_cast<CharClass>(chars_[i] >> 24); }
    uint32_t offset(size_t i) const {
        return offsets_[i];
    }  // byte offset; i == size() gives the end

  private:
    std::vector<uint32_t> chars_;    // [n] code point | CharClass << 24
    std::vector<uint32_t> offsets_;  // [n + 1] byte offset of each code point, then the length
};

enum class SplitPattern : uint8_t {
    kDigits,   // \p{N}{1,3}
    kCjkKana,  // [一-龥぀-ゟ゠-ヿ]+
    kWords,    // DeepSeek-V3's word/punctuation/whitespace pattern (see tokenizer_split.cpp)
};

// The pattern whose regex text is exactly `regex` (the decoded JSON string), if supported.
std::optional<SplitPattern> find_split_pattern(std::string_view regex);

// The regex texts of all supported patterns, for error messages.
std::vector<std::string> supported_split_regexes();

// Length in code points of the match of `pattern` starting at code point i of text[0, end), or 0
// when no alternative matches there (none of the supported patterns matches the empty string).
size_t split_match(SplitPattern pattern, const DecodedText& text, size_t i, size_t end);

}  // namespace cpfill::tokenizer
