// Invariant failures: print where and why, then abort (a bug, never bad input).
#include "kiln/base/error.h"

#include <cstdio>
#include <cstdlib>

namespace kiln {

void assert_fail(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "kiln: assertion failed at %s:%d: %s %s\n", file, line, cond, msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace kiln
