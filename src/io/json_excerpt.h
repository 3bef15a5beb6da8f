// A short, printable excerpt of a JSON value for error messages. Untrusted files reach error
// messages through this, so it must never throw and never recurse without bound: the output is cut
// at `max_bytes` (on a UTF-8 character boundary, ending in "..."), strings are escaped with invalid
// UTF-8 replaced by U+FFFD, and containers are written only as deep as the budget allows.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace cpfill {

std::string json_excerpt(const nlohmann::json& value, size_t max_bytes = 64);

}  // namespace cpfill
