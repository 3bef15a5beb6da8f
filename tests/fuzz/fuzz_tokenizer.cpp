// libFuzzer target for the tokenizer: tokenizer.json parsing and encode/decode of arbitrary bytes.
// An input starting with '{' is a tokenizer.json up to the first NUL byte, then the text to encode;
// any other input is text for a built-in byte-level BPE tokenizer that uses every supported Split
// regex and an added token with lstrip/rstrip. Loading may only throw cpfill::Error; for an
// accepted tokenizer, encode must give ids in [0, vocab_size), decode must accept them, and the
// decoded text must survive a second round trip unchanged. With the built-in tokenizer, plain ASCII
// text without the stripping "<s>" must come back exactly.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"
#include "io/tokenizer.h"
#include "io/tokenizer_bpe.h"
#include "io/tokenizer_split.h"

namespace {

using json = nlohmann::json;

json built_in_json() {
    using cpfill::tokenizer::to_byte_level;
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[to_byte_level(std::string(1, static_cast<char>(b)))] = b;
    json merges = json::array();
    for (const char* pair : {"a a", "t h", "th e", "\xc4\xa0 t", "1 2", "e r"}) {
        const std::string p = pair;
        const size_t space = p.find(' ');
        const std::string joined = p.substr(0, space) + p.substr(space + 1);
        if (!vocab.contains(joined)) vocab[joined] = static_cast<int>(vocab.size());
        merges.push_back(p);
    }
    json splits = json::array();
    for (const std::string& regex : cpfill::tokenizer::supported_split_regexes())
        splits.push_back({{"type", "Split"},
                          {"pattern", {{"Regex", regex}}},
                          {"behavior", "Isolated"},
                          {"invert", false}});
    splits.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}});
    return json{
        {"version", "1.0"},
        {"added_tokens",
         json::array({{{"id", 300}, {"content", "<sp>"}, {"special", true}},
                      {{"id", 301}, {"content", "<s>"}, {"lstrip", true}, {"rstrip", true}}})},
        {"normalizer", nullptr},
        {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", splits}}},
        {"post_processor", nullptr},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
}

const cpfill::Tokenizer& built_in() {
    static const cpfill::Tokenizer t =
        cpfill::Tokenizer::from_json(built_in_json().dump(), "built-in");
    return t;
}

std::string round_trip(const cpfill::Tokenizer& t, std::string_view text, bool special) {
    const std::vector<int32_t> ids = t.encode(text, special);
    for (int32_t id : ids)
        if (id < 0 || id >= t.vocab_size()) __builtin_trap();
    return t.decode(ids);  // not caught: ids from encode must decode
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    std::optional<cpfill::Tokenizer> loaded;
    std::string_view text = input;
    if (!input.empty() && input[0] == '{') {
        const size_t nul = input.find('\0');
        const std::string_view doc = input.substr(0, nul);
        text = nul == std::string_view::npos ? std::string_view() : input.substr(nul + 1);
        try {
            loaded.emplace(cpfill::Tokenizer::from_json(doc, "fuzz/tokenizer.json"));
        } catch (const cpfill::Error&) {
            return 0;  // rejected with a message: the expected outcome for malformed input
        }
    }
    const cpfill::Tokenizer& t = loaded ? *loaded : built_in();
    for (bool special : {false, true}) {
        const std::string once = round_trip(t, text, special);
        if (round_trip(t, once, special) != once) __builtin_trap();
        bool ascii = true;
        for (char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
        if (!loaded && ascii && text.find("<s>") == std::string_view::npos && once != text)
            __builtin_trap();
    }
    return 0;
}
