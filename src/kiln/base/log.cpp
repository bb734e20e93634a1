// Logging level from KILN_LOG (default warn), one line per message on stderr.
#include "kiln/base/log.h"

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

static const Level g_level = initial_level();

Level level() { return g_level; }

void write(Level l, const std::string& msg) {
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::fprintf(stderr, "kiln %s: %s\n", names[static_cast<int>(l)], msg.c_str());
}

}  // namespace kiln::log
