// Decoders of tokenizer.json ("decoder"): ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip,
// BPEDecoder, WordPiece and Sequence. Like HF `tokenizers`, each step rewrites the list of token
// strings; the final text is the concatenation of what the chain leaves.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kiln/base/json.h"

namespace kiln::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// null -> nullptr (tokens are then joined with spaces, as HF does without a decoder).
std::unique_ptr<Decoder> make_decoder(const Json& j, const std::string& where, int depth = 0);

// ByteLevel decoding of one whole list: characters of the GPT-2 byte alphabet become their bytes
// (a token with any other character is taken as its raw UTF-8), and the bytes are repaired to valid
// UTF-8 (U+FFFD for invalid sequences).
std::string byte_level_decode(const std::vector<std::string>& tokens);

}  // namespace kiln::tokenizer
