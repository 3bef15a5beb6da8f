// The JSON body of an error response.
#include "serve/http_error.h"

#include <nlohmann/json.hpp>

namespace cpfill::serve {

std::string error_body(const std::string& message, const std::string& type, int status) {
    nlohmann::json j;
    j["error"] = {{"message", message}, {"type", type}, {"code", status}};
    return j.dump();
}

}  // namespace cpfill::serve
