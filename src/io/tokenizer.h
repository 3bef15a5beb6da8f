// Tokenizer: loads a Hugging Face tokenizer.json of the byte-level BPE kind (DeepSeek-V3/V4's) and
// encodes/decodes exactly as the reference implementation, @lenml/tokenizers (a port of
// transformers.js), does. Supported: normalizer none or an empty Sequence; pre-tokenizer a
// Sequence of Split steps (Isolated, with the regexes of DeepSeek's file; see tokenizer_split.h)
// ending in ByteLevel without prefix space or regex; BPE model; added/special tokens (matched
// before pre-tokenization, longest first); post-processor ByteLevel, TemplateProcessing or a
// Sequence of them; decoder ByteLevel. Anything else fails at load with a cpfill::Error naming the
// field. Text that is not valid UTF-8 is read with U+FFFD for each invalid subpart. See
// docs/tokenizer.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cpfill {

namespace tokenizer {
struct TokenizerData;
}

class Tokenizer {
  public:
    // Reads and validates tokenizer.json; throws cpfill::Error naming the file and the field.
    static Tokenizer load(const std::string& tokenizer_json_path);
    // The same from the file's text; `source` names it in error messages.
    static Tokenizer from_json(std::string_view json_text, const std::string& source);

    // Token ids of `text` (UTF-8). With add_special_tokens the post-processor's special tokens
    // are added (TemplateProcessing's, e.g. BOS; the ByteLevel post-processor of DeepSeek's
    // file adds none). Added tokens written in the text (e.g. "<｜User｜>") become their ids
    // either way. Thread-safe.
    std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;

    // Text of `ids`: added tokens verbatim, the bytes of the others decoded as UTF-8 with U+FFFD
    // for invalid subparts. Throws cpfill::Error for an id outside [0, vocab_size()) or unused.
    std::string decode(const std::vector<int32_t>& ids) const;

    // One more than the largest id of the vocabulary and the added tokens (128815 for DeepSeek).
    int64_t vocab_size() const;

    // The id of a token as spelled in the vocabulary (byte-level, e.g. "Ġthe") or of an added
    // token ("<｜begin▁of▁sentence｜>").
    std::optional<int32_t> token_id(std::string_view token) const;

  private:
    explicit Tokenizer(std::shared_ptr<const tokenizer::TokenizerData> data);

    std::shared_ptr<const tokenizer::TokenizerData> data_;  // immutable, shared by copies
};

}  // namespace cpfill
