// What a stored KV block or prompt cache is only valid for: the model's weights and config, and the
// tokenizer that made its token ids. Both are 64-bit fingerprints (XXH3), stable across runs and
// folders: the same weights moved elsewhere keep their fingerprint, a fine-tune of the same shapes
// does not.
#pragma once
#include <cstdint>

#include "kiln/io/safetensors.h"
#include "kiln/model/config.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::kvstore {

// config.json as parsed, then every weight's name, dtype, shape and first 64 bytes (a fine-tune
// or re-quantization of the same architecture changes those), in name order.
uint64_t model_fingerprint(const model::ModelConfig& config, const io::WeightSet& weights);
// Every id's token string and special flag, and the BOS/EOS tokens: tokenizers that give the same
// text the same ids agree here.
uint64_t tokenizer_fingerprint(const tokenizer::Tokenizer& tok);

}  // namespace kiln::kvstore
