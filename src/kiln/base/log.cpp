// Logging level from KILN_LOG (default warn), one line per message on stderr.
#include "kiln/base/log.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace kiln::log {

static Level initial_level() {
  const char* e = std::getenv("KILN_LOG");
  if (!e) return Level::warn;
  if (!std::strcmp(e, "debug")) return Level::debug;
  if (!std::strcmp(e, "info")) return Level::info;
  if (!std::strcmp(e, "error")) return Level::error;
  return Level::warn;
}

static std::atomic<int> g_level{static_cast<int>(initial_level())};

Level level() { return static_cast<Level>(g_level.load(std::memory_order_relaxed)); }
void set_level(Level l) { g_level.store(static_cast<int>(l)); }

void write(Level l, const std::string& msg) {
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::fprintf(stderr, "kiln %s: %s\n", names[static_cast<int>(l)], msg.c_str());
}

}  // namespace kiln::log
