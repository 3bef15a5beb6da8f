// What a loaded tokenizer.json becomes (internal to src/io/tokenizer*.cpp): the token tables, the
// added-token matcher, the pre-tokenizer steps, the BPE merges and the post-processor's ids.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/tokenizer_bpe.h"
#include "io/tokenizer_split.h"

namespace cpfill::tokenizer {

struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct AddedToken {
    std::string content;
    int32_t id = 0;
    bool lstrip = false;  // strips whitespace from the end of the text before it
    bool rstrip = false;  // strips whitespace from the start of the text after it
};

// Byte trie over the added tokens' contents: finds the longest one starting at a position.
class AddedTokenTrie {
  public:
    void insert(std::string_view content, int32_t token_index);
    // Index into TokenizerData::added of the longest added token that `text` starts with, or -1.
    int32_t longest_prefix(std::string_view text) const;
    bool may_start(uint8_t byte) const { return first_byte_[byte]; }

  private:
    struct Node {
        std::vector<std::pair<uint8_t, int32_t>> children;  // (byte, node), sorted by byte
        int32_t token = -1;
    };
    std::vector<Node> nodes_{Node{}};
    bool first_byte_[256] = {};
};

struct TokenizerData {
    std::string source;  // the file, for error messages

    TokenMap token_to_id;               // vocabulary, then added tokens (they win on a clash)
    std::vector<std::string> id_token;  // [vocab_size] spelling of each id ("" when unused)
    std::vector<std::string> id_bytes;  // [vocab_size] bytes a non-added token decodes to
    std::vector<uint8_t> id_state;      // [vocab_size] 0 unused, 1 vocabulary, 2 added token

    std::vector<AddedToken> added;
    TokenMap added_by_content;  // content -> index into `added`
    AddedTokenTrie added_trie;
    bool any_strip = false;  // some added token has lstrip or rstrip

    std::vector<SplitPattern> splits;  // pre-tokenizer Split steps, in order, then ByteLevel
    BpeModel bpe;
    bool ignore_merges = false;  // BPE: a pre-token found whole in the vocabulary is not merged

    std::vector<int32_t> special_prefix;  // post-processor ids around the sequence
    std::vector<int32_t> special_suffix;  // (with add_special_tokens)
};

// Parses and validates the text of a tokenizer.json (tokenizer_load.cpp).
TokenizerData parse_tokenizer_json(std::string_view json_text, const std::string& source);

}  // namespace cpfill::tokenizer
