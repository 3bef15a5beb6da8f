// Byte-level BPE: turns the UTF-8 bytes of one pre-token into token ids. Every byte starts as the
// id of its GPT-2 byte-level character (bytes_to_unicode); then the adjacent pair with the lowest
// merge rank is merged, the leftmost one on ties, until no pair has a rank — the order of HF
// tokenizers and of @lenml/tokenizers (whose heap breaks ties by position).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cpfill::tokenizer {

// The GPT-2 byte-level alphabet: byte b is written as the code point byte_level_char(b).
uint32_t byte_level_char(uint8_t b);
// The byte-level spelling (UTF-8) of raw bytes, e.g. " the" -> "Ġthe".
std::string to_byte_level(std::string_view bytes);
// The inverse; false when `text` has a character outside the alphabet.
bool from_byte_level(std::string_view text, std::string& bytes);

class BpeModel {
  public:
    struct Merge {
        int32_t left;    // token id
        int32_t right;   // token id
        int32_t result;  // token id of the concatenation
    };

    BpeModel() = default;
    // `byte_ids[b]` is the id of byte b's byte-level character; `merges` in rank order.
    BpeModel(const std::array<int32_t, 256>& byte_ids, const std::vector<Merge>& merges);

    // Appends the ids of the BPE encoding of `bytes` (non-empty) to `out`.
    void encode(std::string_view bytes, std::vector<int32_t>& out) const;

  private:
    struct Slot {
        uint64_t key = kEmpty;  // left << 32 | right
        int32_t rank = 0;
        int32_t result = 0;
    };
    static constexpr uint64_t kEmpty = ~uint64_t{0};

    const Slot* find(int32_t left, int32_t right) const;
    void encode_small(std::string_view bytes, std::vector<int32_t>& out) const;
    void encode_large(std::string_view bytes, std::vector<int32_t>& out) const;

    std::array<int32_t, 256> byte_ids_{};
    std::vector<Slot> slots_;  // open addressing, linear probing, power-of-two size
    uint64_t mask_ = 0;
};

}  // namespace cpfill::tokenizer
