// Errors a client caused or the server refuses for (docs/serve.md "Errors"): an HTTP status, an
// OpenAI-style error type and a message naming what was expected and what was found. Thrown by the
// request parsers and the scheduler, turned into {"error": {"message": …, "type": …}} by the HTTP
// layer; nothing else sees them.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace cpfill::serve {

class HttpError : public std::runtime_error {
  public:
    HttpError(int status, std::string type, const std::string& message)
        : std::runtime_error(message), status_(status), type_(std::move(type)) {}
    int status() const { return status_; }
    const std::string& type() const { return type_; }

  private:
    int status_;
    std::string type_;
};

// 400 invalid_request_error.
template <typename... Args>
[[noreturn]] void bad_request(fmt::format_string<Args...> f, Args&&... args) {
    throw HttpError(400, "invalid_request_error", fmt::format(f, std::forward<Args>(args)...));
}

// The JSON body of an error response: {"error": {"message": …, "type": …, "code": status}}.
std::string error_body(const std::string& message, const std::string& type, int status);

}  // namespace cpfill::serve
