// kiln's version: `kiln --version`, the User-Agent the Hub sees, generated model cards.
#pragma once

namespace kiln {

inline constexpr const char* kVersion = "0.1.0";

}  // namespace kiln
