// Tokenizer::encode/decode, following @lenml/tokenizers' PreTrainedTokenizer._encode_text:
// split the text at added tokens (longest match, scanning left to right), apply their
// lstrip/rstrip, run each remaining section through the pre-tokenizer (each Split step re-splits
// the pieces of the previous one) and BPE, then add the post-processor's special ids.
#include "io/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "io/tokenizer_data.h"

namespace cpfill {

using tokenizer::CharClass;
using tokenizer::CharClassTable;
using tokenizer::DecodedText;
using tokenizer::TokenizerData;

namespace tokenizer {

void AddedTokenTrie::insert(std::string_view content, int32_t token_index) {
    first_byte_[static_cast<uint8_t>(content[0])] = true;
    int32_t node = 0;
    for (char ch : content) {
        const auto byte = static_cast<uint8_t>(ch);
        auto& kids = nodes_[node].children;
        auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(byte, int32_t{-1}));
        if (it == kids.end() || it->first != byte) {
            it = kids.insert(it, {byte, static_cast<int32_t>(nodes_.size())});
            nodes_.emplace_back();
        }
        node = it->second;
    }
    if (nodes_[node].token < 0) nodes_[node].token = token_index;
}

int32_t AddedTokenTrie::longest_prefix(std::string_view text) const {
    int32_t node = 0, found = -1;
    for (char ch : text) {
        const auto& kids = nodes_[node].children;
        const auto byte = static_cast<uint8_t>(ch);
        auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(byte, int32_t{-1}));
        if (it == kids.end() || it->first != byte) break;
        node = it->second;
        if (nodes_[node].token >= 0) found = nodes_[node].token;
    }
    return found;
}

}  // namespace tokenizer

namespace {

// A piece of the text between added tokens, or an added token (index into TokenizerData::added).
struct Section {
    std::string_view text;
    int32_t added = -1;
    bool stripped = false;  // shortened by a neighbour's lstrip/rstrip
};

std::vector<Section> split_added_tokens(const TokenizerData& d, std::string_view text) {
    std::vector<Section> out;
    size_t start = 0;
    for (size_t i = 0; i < text.size(); ++i) {
        if (!d.added_trie.may_start(static_cast<uint8_t>(text[i]))) continue;
        const int32_t t = d.added_trie.longest_prefix(text.substr(i));
        if (t < 0) continue;
        if (i > start) out.push_back({text.substr(start, i - start)});
        out.push_back({text.substr(i, d.added[t].content.size()), t});
        i += d.added[t].content.size() - 1;
        start = i + 1;
    }
    if (start < text.size()) out.push_back({text.substr(start)});
    return out;
}

// JavaScript's trimStart/trimEnd (the \s characters) on well-formed UTF-8.
std::string_view trim_start(std::string_view s) {
    const CharClassTable& table = CharClassTable::get();
    size_t i = 0;
    while (i < s.size()) {
        size_t j = i;
        if (table(tokenizer::next_code_point(s, j)) != CharClass::kSpace) break;
        i = j;
    }
    return s.substr(i);
}

std::string_view trim_end(std::string_view s) {
    const CharClassTable& table = CharClassTable::get();
    size_t keep = 0, i = 0;
    while (i < s.size()) {
        if (table(tokenizer::next_code_point(s, i)) != CharClass::kSpace) keep = i;
    }
    return s.substr(0, keep);
}

// Shortens a section for a neighbour's lstrip/rstrip. Like the reference, which compares strings,
// an added token that loses characters this way is plain text from then on.
void strip(Section& s, std::string_view shorter) {
    if (shorter.size() == s.text.size()) return;
    s.text = shorter;
    s.added = -1;
    s.stripped = true;
}

// One encode call's state: the text, its decoded code points, the output, and a cache of the
// pieces already encoded (keyed by their bytes; the value is where their ids sit in `out`).
struct Encoder {
    static constexpr size_t kMaxCachedPiece = 64;  // bytes; longer pieces rarely repeat

    const TokenizerData& d;
    std::string_view bytes;
    DecodedText text;
    std::vector<int32_t>& out;
    std::unordered_map<std::string_view, std::pair<size_t, size_t>> cache;  // -> (offset, count)

    // Byte-level BPE of one final pre-token, code points [a, b).
    void piece(size_t a, size_t b) {
        const std::string_view p = bytes.substr(text.offset(a), text.offset(b) - text.offset(a));
        if (p.size() <= kMaxCachedPiece) {
            auto [it, inserted] = cache.try_emplace(p, out.size(), 0);
            if (!inserted) {
                const auto [offset, count] = it->second;
                out.resize(out.size() + count);
                std::copy_n(out.begin() + offset, count, out.end() - count);
                return;
            }
            bpe(p);
            it->second.second = out.size() - it->second.first;
        } else {
            bpe(p);
        }
    }

    void bpe(std::string_view p) {
        if (d.ignore_merges) {
            auto it = d.token_to_id.find(tokenizer::to_byte_level(p));
            if (it != d.token_to_id.end()) {
                out.push_back(it->second);
                return;
            }
        }
        d.bpe.encode(p, out);
    }

    // Applies Split step `step` (of d.splits) to code points [lo, hi), recursing into the next
    // step for every piece: the matches and the text between them (behavior Isolated).
    void split(size_t step, size_t lo, size_t hi) {
        const auto emit = [&](size_t a, size_t b) {
            if (step + 1 < d.splits.size()) {
                split(step + 1, a, b);
            } else {
                piece(a, b);
            }
        };
        size_t prev = lo;
        for (size_t i = lo; i < hi;) {
            const size_t n = tokenizer::split_match(d.splits[step], text, i, hi);
            if (n == 0) {
                ++i;
                continue;
            }
            if (prev < i) emit(prev, i);
            emit(i, i + n);
            i += n;
            prev = i;
        }
        if (prev < hi) emit(prev, hi);
    }

    void section(std::string_view s) {
        bytes = s;
        text.assign(s);
        if (d.splits.empty()) {
            piece(0, text.size());
        } else {
            split(0, 0, text.size());
        }
    }
};

}  // namespace

Tokenizer::Tokenizer(std::shared_ptr<const TokenizerData> data) : data_(std::move(data)) {}

Tokenizer Tokenizer::load(const std::string& tokenizer_json_path) {
    std::ifstream in(tokenizer_json_path, std::ios::binary);
    CPFILL_CHECK(in.good(), "cannot open tokenizer.json '{}'", tokenizer_json_path);
    std::ostringstream text;
    text << in.rdbuf();
    CPFILL_CHECK(!in.bad(), "cannot read tokenizer.json '{}'", tokenizer_json_path);
    return from_json(text.str(), tokenizer_json_path);
}

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& source) {
    return Tokenizer(
        std::make_shared<const TokenizerData>(tokenizer::parse_tokenizer_json(json_text, source)));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
    const TokenizerData& d = *data_;
    std::string sanitized;
    if (!tokenizer::is_valid_utf8(text)) {
        sanitized = tokenizer::sanitize_utf8(text);
        text = sanitized;
    }
    std::vector<Section> sections = split_added_tokens(d, text);
    if (d.any_strip) {
        for (size_t i = 0; i < sections.size(); ++i) {
            if (sections[i].added < 0) continue;
            const tokenizer::AddedToken& a = d.added[sections[i].added];
            if (a.lstrip && i > 0) strip(sections[i - 1], trim_end(sections[i - 1].text));
            if (a.rstrip && i + 1 < sections.size())
                strip(sections[i + 1], trim_start(sections[i + 1].text));
        }
    }
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 8);
    if (add_special_tokens) out = d.special_prefix;
    Encoder encoder{d, {}, {}, out, {}};
    for (const Section& s : sections) {
        if (s.text.empty()) continue;
        if (s.added >= 0) {
            out.push_back(d.added[s.added].id);
            continue;
        }
        // As the reference does, a section that spells an added token after stripping is one
        // (untouched sections cannot: the splitter would have matched them).
        if (s.stripped) {
            auto it = d.added_by_content.find(s.text);
            if (it != d.added_by_content.end()) {
                out.push_back(d.added[it->second].id);
                continue;
            }
        }
        encoder.section(s.text);
    }
    if (add_special_tokens) out.insert(out.end(), d.special_suffix.begin(), d.special_suffix.end());
    return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
    const TokenizerData& d = *data_;
    std::string out, bytes;  // bytes: the run of non-added tokens, decoded together
    const auto flush = [&] {
        if (bytes.empty()) return;
        out += tokenizer::is_valid_utf8(bytes) ? bytes : tokenizer::sanitize_utf8(bytes);
        bytes.clear();
    };
    for (size_t i = 0; i < ids.size(); ++i) {
        const int32_t id = ids[i];
        CPFILL_CHECK(id >= 0 && id < vocab_size() && d.id_state[id] != 0,
                     "tokenizer: ids[{}] = {} is not a token id (vocabulary of {}, '{}')", i, id,
                     vocab_size(), d.source);
        if (d.id_state[id] == 2) {
            flush();
            out += d.id_token[id];
        } else {
            bytes += d.id_bytes[id];
        }
    }
    flush();
    return out;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(data_->id_state.size()); }

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
    auto it = data_->token_to_id.find(token);
    if (it == data_->token_to_id.end()) return std::nullopt;
    return it->second;
}

}  // namespace cpfill
