// Hand-written matchers for the Split regexes of DeepSeek's tokenizer.json (see tokenizer_split.h).
// Each alternative of a regex is one function returning its match length at a position (0: no
// match); where a greedy quantifier is followed by more pattern, the function computes the
// position that JavaScript's backtracking settles on, explained above it.
#include "io/tokenizer_split.h"

#include "core/error.h"

namespace cpfill::tokenizer {

namespace {

// The regex texts, as they appear in tokenizer.json once its JSON string escapes are decoded
// (\r and \n below are the literal CR and LF characters the file has inside the classes).
constexpr std::string_view kDigitsRegex = "\\p{N}{1,3}";
constexpr std::string_view kCjkKanaRegex = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+";
constexpr std::string_view kWordsRegex =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"  // A: ASCII punctuation + letters
    "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"             // B: optional lead + letters/marks
    "| ?[\\p{P}\\p{S}]+[\r\n]*"                              // C: punctuation/symbols + newlines
    "|\\s*[\r\n]+"                                           // D: whitespace ending in newlines
    "|\\s+(?!\\S)"                                           // E: whitespace not before a word
    "|\\s+";                                                 // F: any whitespace

bool is_cr_lf(uint32_t cp) { return cp == '\r' || cp == '\n'; }
bool is_ascii_letter(uint32_t cp) { return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z'; }
bool is_ascii_punct(uint32_t cp) {  // the class of alternative A: every ASCII P and S character
    return (cp >= 0x21 && cp <= 0x2f) || (cp >= 0x3a && cp <= 0x40) || (cp >= 0x5b && cp <= 0x60) ||
           (cp >= 0x7b && cp <= 0x7e);
}
bool is_letter_or_mark(CharClass c) { return c == CharClass::kLetter || c == CharClass::kMark; }
bool is_punct_or_symbol(CharClass c) { return c == CharClass::kPunct || c == CharClass::kSymbol; }

// Number of consecutive code points from i (before end) that satisfy `pred(text, k)`.
template <typename Pred>
size_t run_length(const DecodedText& t, size_t i, size_t end, Pred pred) {
    size_t k = i;
    while (k < end && pred(t, k)) ++k;
    return k - i;
}

size_t match_digits(const DecodedText& t, size_t i, size_t end) {
    size_t n = 0;
    while (n < 3 && i + n < end && t.cls(i + n) == CharClass::kNumber) ++n;
    return n;
}

size_t match_cjk_kana(const DecodedText& t, size_t i, size_t end) {
    return run_length(t, i, end, [](const DecodedText& s, size_t k) {
        const uint32_t cp = s.cp(k);
        return (cp >= 0x4e00 && cp <= 0x9fa5) || (cp >= 0x3040 && cp <= 0x30ff);
    });
}

const auto kLetterOrMark = [](const DecodedText& s, size_t k) {
    return is_letter_or_mark(s.cls(k));
};
const auto kPunctOrSymbol = [](const DecodedText& s, size_t k) {
    return is_punct_or_symbol(s.cls(k));
};
const auto kSpace = [](const DecodedText& s, size_t k) { return s.cls(k) == CharClass::kSpace; };
const auto kCrLf = [](const DecodedText& s, size_t k) { return is_cr_lf(s.cp(k)); };

size_t match_words(const DecodedText& t, size_t i, size_t end) {
    const uint32_t c0 = t.cp(i);
    const CharClass k0 = t.cls(i);
    // A: [ASCII punct][A-Za-z]+
    if (is_ascii_punct(c0)) {
        const size_t n = run_length(
            t, i + 1, end, [](const DecodedText& s, size_t k) { return is_ascii_letter(s.cp(k)); });
        if (n > 0) return 1 + n;
    }
    // B: [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ — with the optional lead first; if the letters do
    // not follow it, backtracking retries without it (the lead itself may be a mark).
    if (!is_cr_lf(c0) && k0 != CharClass::kLetter && !is_punct_or_symbol(k0)) {
        const size_t n = run_length(t, i + 1, end, kLetterOrMark);
        if (n > 0) return 1 + n;
    }
    if (const size_t n = run_length(t, i, end, kLetterOrMark); n > 0) return n;
    // C: ' '?[\p{P}\p{S}]+[\r\n]* — a space is not P/S, so without it the match fails too.
    {
        const size_t p = i + (c0 == ' ' ? 1 : 0);
        const size_t n = run_length(t, p, end, kPunctOrSymbol);
        if (n > 0) return (p - i) + n + run_length(t, p + n, end, kCrLf);
    }
    if (k0 != CharClass::kSpace) return 0;  // D, E and F all start with whitespace
    const size_t ws = run_length(t, i, end, kSpace);
    // D: \s*[\r\n]+ — \s* gives back characters until a CR/LF follows it; that is the last CR/LF
    // of the whitespace run, and [\r\n]+ then takes exactly it.
    for (size_t k = i + ws; k > i; --k) {
        if (is_cr_lf(t.cp(k - 1))) return k - i;
    }
    // E: \s+(?!\S) — the whole run when it ends the text, else all but its last character (which
    // is whitespace, so the lookahead holds) when that leaves at least one. F: \s+ otherwise.
    if (i + ws == end || ws == 1) return ws;
    return ws - 1;
}

}  // namespace

void DecodedText::assign(std::string_view utf8) {
    CPFILL_CHECK(utf8.size() < (size_t{1} << 32), "tokenizer: text of {} bytes exceeds 4 GiB",
                 utf8.size());
    const CharClassTable& table = CharClassTable::get();
    chars_.clear();
    offsets_.clear();
    chars_.reserve(utf8.size());
    offsets_.reserve(utf8.size() + 1);
    size_t i = 0;
    while (i < utf8.size()) {
        offsets_.push_back(static_cast<uint32_t>(i));
        const uint32_t cp = next_code_point(utf8, i);
        chars_.push_back(cp | (static_cast<uint32_t>(table(cp)) << 24));
    }
    offsets_.push_back(static_cast<uint32_t>(utf8.size()));
}

std::optional<SplitPattern> find_split_pattern(std::string_view regex) {
    if (regex == kDigitsRegex) return SplitPattern::kDigits;
    if (regex == kCjkKanaRegex) return SplitPattern::kCjkKana;
    if (regex == kWordsRegex) return SplitPattern::kWords;
    return std::nullopt;
}

std::vector<std::string> supported_split_regexes() {
    return {std::string(kDigitsRegex), std::string(kCjkKanaRegex), std::string(kWordsRegex)};
}

size_t split_match(SplitPattern pattern, const DecodedText& text, size_t i, size_t end) {
    switch (pattern) {
        case SplitPattern::kDigits:
            return match_digits(text, i, end);
        case SplitPattern::kCjkKana:
            return match_cjk_kana(text, i, end);
        case SplitPattern::kWords:
            return match_words(text, i, end);
    }
    return 0;
}

}  // namespace cpfill::tokenizer
