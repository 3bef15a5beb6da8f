// Out-of-line throw so the check macros stay small at every call site.
#include "core/error.h"

#include <cstring>

namespace cpfill::detail {

void throw_error(const char* file, int line, const std::string& message) {
    const char* src = std::strstr(file, "src/");
    throw Error(message, fmt::format("{}:{}", src ? src : file, line));
}

}  // namespace cpfill::detail
