// Symbols kiln_embedded_<i>_begin/_end come from the generated embedded_model.S (cli/CMakeLists.txt),
// one pair per file in KILN_EMBED_NAMES, in that order.
#include "kiln/cli/embedded.h"

#include <array>

#define KILN_EMBED_DECL(i) extern "C" const char kiln_embedded_##i##_begin[], kiln_embedded_##i##_end[];
KILN_EMBED_DECL(0)
KILN_EMBED_DECL(1)
KILN_EMBED_DECL(2)
KILN_EMBED_DECL(3)
KILN_EMBED_DECL(4)

namespace kiln::cli {

static_assert(KILN_EMBED_COUNT == 5, "embedded.cpp declares five embedded files");

const std::map<std::string, std::string_view>& embedded_model_files() {
  static const std::map<std::string, std::string_view> files = [] {
    const std::array<const char*, 5> names = {KILN_EMBED_NAMES};
    const std::array<std::pair<const char*, const char*>, 5> spans = {{
        {kiln_embedded_0_begin, kiln_embedded_0_end},
        {kiln_embedded_1_begin, kiln_embedded_1_end},
        {kiln_embedded_2_begin, kiln_embedded_2_end},
        {kiln_embedded_3_begin, kiln_embedded_3_end},
        {kiln_embedded_4_begin, kiln_embedded_4_end},
    }};
    std::map<std::string, std::string_view> m;
    for (size_t i = 0; i < names.size(); ++i)
      m[names[i]] = std::string_view(spans[i].first, static_cast<size_t>(spans[i].second - spans[i].first));
    return m;
  }();
  return files;
}

}  // namespace kiln::cli
