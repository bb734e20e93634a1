// libFuzzer target: the grammar sources. The first byte picks the parser (0: GBNF, 1: a regex, 2: a JSON
// Schema), the rest is its text. Each input either fails with a one-line "[grammar] ..." error or
// compiles; a compiled grammar then runs the matcher over the input's bytes (accepting, rolling back)
// and must stay consistent. Nothing may crash, hang or leak.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kiln/base/error.h"
#include "kiln/grammar/json_schema.h"
#include "kiln/grammar/matcher.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 4096) return 0;
  const int kind = data[0] % 3;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::shared_ptr<const kiln::grammar::CompiledGrammar> g;
  try {
    kiln::grammar::Grammar gr = kind == 0   ? kiln::grammar::parse_gbnf(text)
                                : kind == 1 ? kiln::grammar::regex_grammar(text)
                                            : kiln::grammar::json_schema_grammar(text).grammar;
    g = std::make_shared<kiln::grammar::CompiledGrammar>(gr);
  } catch (const kiln::Error& e) {
    if (std::strncmp(e.what(), "[grammar] ", 10) != 0 || std::strchr(e.what(), '\n')) std::abort();
    return 0;
  }
  kiln::grammar::Matcher m(g);
  size_t fed = 0;
  for (size_t i = 0; i < text.size(); i += 3) {
    std::string_view tok = std::string_view(text).substr(i, 3);
    kiln::grammar::Matcher before = m;
    if (!m.accept_bytes(tok)) {
      if (!(m == before)) std::abort();  // a rejected token changes nothing
      continue;
    }
    ++fed;
  }
  if (fed != m.n_tokens()) std::abort();
  m.rollback(fed / 2);
  if (m.n_tokens() != fed - fed / 2) std::abort();
  return 0;
}
