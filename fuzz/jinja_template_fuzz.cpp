// libFuzzer target for the Jinja interpreter: the input is a template source; it is parsed and,
// when it parses, rendered against a small chat context. kiln::Error is the only allowed outcome
// of bad input: no crash, hang, leak or sanitizer report.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kiln/base/error.h"
#include "kiln/jinja/renderer.h"

namespace {

const kiln::jinja::DictData& context() {
  static const kiln::jinja::DictData ctx = [] {
    auto j = nlohmann::ordered_json::parse(R"({
      "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi {{ x }} é 😀"},
                   {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                    "function": {"name": "f", "arguments": {"a": 1, "b": [1.5, null, true]}}}]},
                   {"role": "tool", "content": "{\"ok\": 1}"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                 "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}],
      "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "n": 3, "f": 0.5})");
    return kiln::jinja::from_json(j).dict();
  }();
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;  // keeps each run fast; the grammar has no construct that needs more
  std::string source(reinterpret_cast<const char*>(data), size);
  try {
    kiln::jinja::Template t(source);
    t.render(context());
  } catch (const kiln::Error&) {
  }
  return 0;
}
