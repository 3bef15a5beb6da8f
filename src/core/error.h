// Errors: cpfill::Error and the CPFILL_CHECK family. Library code throws; only tools/ prints and
// exits. Messages name what was expected and what was found; the throw site (file:line) travels
// beside the message (Error::location), so what() is what a user reads and the CLI shows the
// location only when asked to (CPFILL_DEBUG=1, docs/cli.md).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace cpfill {

class Error : public std::runtime_error {
  public:
    explicit Error(const std::string& what, std::string location = {})
        : std::runtime_error(what), location_(std::move(location)) {}
    // "src/io/safetensors.cpp:120" for an error thrown by the CPFILL_CHECK family, else empty.
    const std::string& location() const { return location_; }

  private:
    std::string location_;
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
}  // namespace detail

}  // namespace cpfill

// CPFILL_CHECK(cond, "fmt {}", args...): throws cpfill::Error with the formatted message.
#define CPFILL_CHECK(cond, ...)                                                                   \
    do {                                                                                          \
        if (!(cond)) ::cpfill::detail::throw_error(__FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
    } while (0)

// CPFILL_CHECK_EQ(a, b, "what"): "what: expected <b>, found <a>".
#define CPFILL_CHECK_EQ(found, expected, ...)                                      \
    do {                                                                           \
        const auto& cpfill_found_ = (found);                                       \
        const auto& cpfill_expected_ = (expected);                                 \
        if (!(cpfill_found_ == cpfill_expected_))                                  \
            ::cpfill::detail::throw_error(                                         \
                __FILE__, __LINE__,                                                \
                fmt::format("{}: expected {}, found {}", fmt::format(__VA_ARGS__), \
                            cpfill_expected_, cpfill_found_));                     \
    } while (0)

#define CPFILL_FAIL(...) ::cpfill::detail::throw_error(__FILE__, __LINE__, fmt::format(__VA_ARGS__))
