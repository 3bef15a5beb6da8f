// Byte-level BPE (see tokenizer_bpe.h). Pieces up to kSmall bytes merge in flat arrays (a rank per
// adjacent pair, rescanned per merge); longer ones (runs of punctuation or whitespace can be
// kilobytes long) use a heap over a linked list, O(n log n).
#include "io/tokenizer_bpe.h"

#include <algorithm>
#include <climits>

#include "core/error.h"
#include "io/tokenizer_unicode.h"

namespace cpfill::tokenizer {

namespace {

constexpr size_t kSmall = 64;

uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
}

void append_utf8(std::string& out, uint32_t cp) {  // cp < 0x800 here
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else {
        out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
}

}  // namespace

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
// (0x00-0x20, 0x7f-0xa0, 0xad) take U+0100.. in byte order.
uint32_t byte_level_char(uint8_t b) {
    static const std::array<uint32_t, 256> table = [] {
        std::array<uint32_t, 256> t{};
        uint32_t next = 256;
        for (uint32_t c = 0; c < 256; ++c) {
            const bool printable =
                (c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || c >= 0xae;
            t[c] = printable ? c : next++;
        }
        return t;
    }();
    return table[b];
}

std::string to_byte_level(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size() * 2);
    for (char c : bytes) append_utf8(out, byte_level_char(static_cast<uint8_t>(c)));
    return out;
}

bool from_byte_level(std::string_view text, std::string& bytes) {
    static const std::array<int16_t, 324> inverse = [] {  // byte-level chars are < 0x144
        std::array<int16_t, 324> t;
        t.fill(-1);
        for (uint32_t b = 0; b < 256; ++b) t[byte_level_char(static_cast<uint8_t>(b))] = int16_t(b);
        return t;
    }();
    bytes.clear();
    if (!is_valid_utf8(text)) return false;
    size_t i = 0;
    while (i < text.size()) {
        const uint32_t cp = next_code_point(text, i);
        if (cp >= inverse.size() || inverse[cp] < 0) return false;
        bytes.push_back(static_cast<char>(inverse[cp]));
    }
    return true;
}

BpeModel::BpeModel(const std::array<int32_t, 256>& byte_ids, const std::vector<Merge>& merges)
    : byte_ids_(byte_ids) {
    size_t capacity = 16;
    while (capacity < 2 * merges.size()) capacity *= 2;
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    for (size_t rank = 0; rank < merges.size(); ++rank) {
        const Merge& m = merges[rank];
        const uint64_t key = pair_key(m.left, m.right);
        uint64_t h = (key * 0x9e3779b97f4a7c15ull) >> 20;
        while (slots_[h & mask_].key != kEmpty && slots_[h & mask_].key != key) ++h;
        Slot& s = slots_[h & mask_];
        if (s.key == key) continue;  // a repeated merge keeps its first (lowest) rank
        s = Slot{key, static_cast<int32_t>(rank), m.result};
    }
}

const BpeModel::Slot* BpeModel::find(int32_t left, int32_t right) const {
    const uint64_t key = pair_key(left, right);
    uint64_t h = (key * 0x9e3779b97f4a7c15ull) >> 20;
    for (;; ++h) {
        const Slot& s = slots_[h & mask_];
        if (s.key == key) return &s;
        if (s.key == kEmpty) return nullptr;
    }
}

void BpeModel::encode(std::string_view bytes, std::vector<int32_t>& out) const {
    if (bytes.size() == 1) {
        out.push_back(byte_ids_[static_cast<uint8_t>(bytes[0])]);
    } else if (bytes.size() <= kSmall) {
        encode_small(bytes, out);
    } else {
        encode_large(bytes, out);
    }
}

void BpeModel::encode_small(std::string_view bytes, std::vector<int32_t>& out) const {
    int32_t ids[kSmall];
    int32_t ranks[kSmall];    // ranks[k]: rank of the pair (ids[k], ids[k + 1]), INT_MAX if none
    int32_t results[kSmall];  // results[k]: the id that pair merges into
    size_t n = bytes.size();
    for (size_t k = 0; k < n; ++k) ids[k] = byte_ids_[static_cast<uint8_t>(bytes[k])];
    const auto rate = [&](size_t k) {
        const Slot* s = find(ids[k], ids[k + 1]);
        ranks[k] = s ? s->rank : INT_MAX;
        results[k] = s ? s->result : 0;
    };
    for (size_t k = 0; k + 1 < n; ++k) rate(k);
    while (n > 1) {
        size_t best = 0;
        for (size_t k = 1; k + 1 < n; ++k) {
            if (ranks[k] < ranks[best]) best = k;  // strict: the leftmost of equal ranks wins
        }
        if (ranks[best] == INT_MAX) break;
        ids[best] = results[best];
        for (size_t k = best + 1; k + 1 < n; ++k) {
            ids[k] = ids[k + 1];
            ranks[k] = ranks[k + 1];
            results[k] = results[k + 1];
        }
        --n;
        if (best > 0) rate(best - 1);
        if (best + 1 < n) rate(best);
    }
    out.insert(out.end(), ids, ids + n);
}

void BpeModel::encode_large(std::string_view bytes, std::vector<int32_t>& out) const {
    const size_t n = bytes.size();
    // Symbols in a doubly linked list; symbol k keeps its first byte's position k, which breaks
    // ties between equal ranks. rank[k] is the rank of the pair symbol k currently starts
    // (kNone when it has no right neighbour, no merge, or k was merged away). A heap entry
    // (rank << 32 | k) is current exactly when rank[k] still holds that rank: a rank names one
    // (left, right) pair of ids.
    constexpr int32_t kNone = INT32_MAX;
    std::vector<int32_t> ids(n), prev(n), next(n), rank(n, kNone);
    for (size_t k = 0; k < n; ++k) {
        ids[k] = byte_ids_[static_cast<uint8_t>(bytes[k])];
        prev[k] = static_cast<int32_t>(k) - 1;
        next[k] = k + 1 < n ? static_cast<int32_t>(k + 1) : -1;
    }
    std::vector<uint64_t> heap;  // min-heap by (rank, position)
    heap.reserve(2 * n);
    const auto later = [](uint64_t a, uint64_t b) { return a > b; };
    const auto rate = [&](int32_t k) {
        const Slot* s = next[k] >= 0 ? find(ids[k], ids[next[k]]) : nullptr;
        rank[k] = s ? s->rank : kNone;
        if (!s) return;
        heap.push_back((static_cast<uint64_t>(s->rank) << 32) | static_cast<uint32_t>(k));
        std::push_heap(heap.begin(), heap.end(), later);
    };
    for (size_t k = 0; k + 1 < n; ++k) rate(static_cast<int32_t>(k));
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), later);
        const uint64_t top = heap.back();
        heap.pop_back();
        const auto left = static_cast<int32_t>(top & 0xffffffff);
        if (rank[left] != static_cast<int32_t>(top >> 32)) continue;  // stale
        const int32_t right = next[left];
        ids[left] = find(ids[left], ids[right])->result;
        rank[right] = kNone;
        next[left] = next[right];
        if (next[right] >= 0) prev[next[right]] = left;
        if (prev[left] >= 0) rate(prev[left]);
        rate(left);
    }
    for (int32_t k = 0; k >= 0; k = next[k]) out.push_back(ids[k]);
}

}  // namespace cpfill::tokenizer
