// json_excerpt: see the header; the budget check before each value bounds both length and depth.
#include "io/json_excerpt.h"

namespace cpfill {

namespace {

using json = nlohmann::json;

// Drops a trailing partial UTF-8 sequence, so a cut never splits a character.
void trim_partial_utf8(std::string& s) {
    size_t i = s.size();
    size_t continuation = 0;
    while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80 && continuation < 3) {
        --i;
        ++continuation;
    }
    if (i == 0) return;
    const auto lead = static_cast<unsigned char>(s[i - 1]);
    // Continuation bytes the lead byte announces; 0 for ASCII or an invalid byte.
    const size_t need = (lead & 0xE0) == 0xC0   ? 1
                        : (lead & 0xF0) == 0xE0 ? 2
                        : (lead & 0xF8) == 0xF0 ? 3
                                                : 0;
    if (continuation < need) s.resize(i - 1);
}

// Appends `value` to `out`; stops (returns false) once `out` is longer than `budget`, which also
// bounds the recursion depth: each level writes at least one byte before descending.
bool append(const json& value, size_t budget, std::string& out) {
    if (out.size() > budget) return false;
    if (value.is_object() || value.is_array()) {
        const bool object = value.is_object();
        out += object ? '{' : '[';
        bool first = true;
        for (auto it = value.begin(); it != value.end(); ++it) {
            if (!first) out += ',';
            first = false;
            if (object) {
                out += json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace);
                out += ':';
            }
            if (!append(*it, budget, out)) return false;
        }
        out += object ? '}' : ']';
    } else {
        // Strings come from the file as raw bytes: replace what is not UTF-8 instead of throwing.
        out += value.dump(-1, ' ', false, json::error_handler_t::replace);
    }
    return out.size() <= budget;
}

}  // namespace

std::string json_excerpt(const json& value, size_t max_bytes) {
    std::string out;
    if (append(value, max_bytes, out)) return out;
    out.resize(max_bytes);
    trim_partial_utf8(out);
    return out + "...";
}

}  // namespace cpfill
