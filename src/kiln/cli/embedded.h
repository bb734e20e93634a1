// The default model built into the binary (stories260K, embedded at build time by .incbin).
#pragma once
#include <map>
#include <string>
#include <string_view>

namespace kiln::cli {

inline constexpr const char* kEmbeddedName = "<embedded stories260K>";
// File name -> bytes (config.json, generation_config.json, tokenizer.json, tokenizer_config.json, model.safetensors).
const std::map<std::string, std::string_view>& embedded_model_files();

}  // namespace kiln::cli
