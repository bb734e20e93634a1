// libFuzzer target: arbitrary bytes as tokenizer.json (Tokenizer::from_json); when the input holds a
// "\n\x01\n" line, the part after it is used as tokenizer_config.json. Each input either loads, and
// then encodes a short mixed-script text to ids inside the vocabulary and decodes/streams them back
// to valid UTF-8, or fails with a one-line "[tokenizer] fuzz.json..." error. Nothing may crash.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kiln/base/error.h"
#include "kiln/base/utf8.h"
#include "kiln/tokenizer/tokenizer.h"

namespace {
void check_error(const kiln::Error& e) {
  const char* what = e.what();
  if (std::strncmp(what, "[tokenizer] fuzz.json", 21) != 0 || std::strchr(what, '\n')) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string input(reinterpret_cast<const char*>(data), size);
  std::string config;
  if (size_t sep = input.find("\n\x01\n"); sep != std::string::npos) {
    config = input.substr(sep + 3);
    input.resize(sep);
  }
  std::unique_ptr<kiln::tokenizer::Tokenizer> tok;
  try {
    tok = kiln::tokenizer::Tokenizer::from_json(input, config, "fuzz.json");
  } catch (const kiln::Error& e) {
    check_error(e);
    return 0;
  }
  static const char* const kTexts[] = {
      "Hello, world! 123 <s>caf\xC3\xA9</s> \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80\n\t  x",
      "",
      " \xE2\x96\x81 <|endoftext|> 4567 \x80 y'all",
  };
  for (const char* text : kTexts) {
    std::vector<int32_t> ids;
    try {
      ids = tok->encode(text, true);
    } catch (const kiln::Error& e) {  // a pathological regex may hit the backtracking limit
      check_error(e);
      continue;
    }
    for (int32_t id : ids) {
      if (id < 0 || id >= tok->vocab_size()) std::abort();
    }
    for (bool skip : {true, false}) {
      std::string full = tok->decode(ids, skip);
      if (!kiln::utf8::valid(full)) std::abort();
      kiln::tokenizer::StreamDecoder stream(*tok, skip);
      for (int32_t id : ids) {
        if (!kiln::utf8::valid(stream.push(id))) std::abort();
      }
      if (!kiln::utf8::valid(stream.flush())) std::abort();
    }
    for (int32_t id : ids) (void)tok->id_to_token(id);
  }
  (void)tok->bos_id();
  (void)tok->token_to_id("<s>");
  return 0;
}
