// Minimal leveled logging to stderr. KILN_LOG=debug|info|warn|error sets the level.
#pragma once
#include <fmt/format.h>

#include <cstdio>

namespace kiln::log {

enum class Level { debug = 0, info = 1, warn = 2, error = 3 };
Level level();
void write(Level l, const std::string& msg);

template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... a) {
  if (level() <= Level::debug) write(Level::debug, fmt::format(f, std::forward<Args>(a)...));
}
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... a) {
  if (level() <= Level::info) write(Level::info, fmt::format(f, std::forward<Args>(a)...));
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... a) {
  if (level() <= Level::warn) write(Level::warn, fmt::format(f, std::forward<Args>(a)...));
}

}  // namespace kiln::log
