// Errors: kiln::Error for bad input a person can fix (a "[component] message" line),
// KILN_ASSERT for broken invariants (aborts with file and line).
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kiln {

// Bad input (files, requests, flags). what() is one line: "[component] what is wrong; what to do".
class Error : public std::runtime_error {
 public:
  Error(std::string component, const std::string& message)
      : std::runtime_error("[" + component + "] " + message), component_(std::move(component)) {}
  const std::string& component() const { return component_; }

 private:
  std::string component_;
};

template <typename... Args>
[[noreturn]] void fail(const std::string& component, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(component, fmt::format(f, std::forward<Args>(args)...));
}

[[noreturn]] void assert_fail(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace kiln

#define KILN_ASSERT(cond, ...)                                                            \
  do {                                                                                    \
    if (!(cond)) ::kiln::assert_fail(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__)); \
  } while (0)
