// Model folder resolution: a --model argument is a local folder with config.json, or a
// Hugging Face repo id ("org/name") found in the local HF cache (models--org--name/snapshots/*).
#pragma once
#include <string>
#include <vector>

namespace kiln::io {

// The HF hub cache folders to search, in precedence order: $HF_HUB_CACHE, $HF_HOME/hub,
// $XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub (unset variables skipped, no duplicates).
std::vector<std::string> hf_hub_cache_dirs();

// A --model argument -> a local folder containing config.json. The local folder first, then the
// HF cache for "org/name" (the snapshot refs/main points to when present, else the newest) or
// "org/name@rev" (the snapshot refs/rev points to, or the snapshot named rev: a commit).
// Error (kiln::Error "[model] ...", one line) lists every place it looked.
std::string resolve_model_path(const std::string& arg);

}  // namespace kiln::io
