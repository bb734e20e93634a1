#include "kiln/cli/prompt_cache_args.h"

#include "kiln/base/log.h"
#include "kiln/engine/kv_sizing.h"

namespace kiln::cli {

void PromptCacheArgs::add_to(CLI::App* cmd) {
  cmd->add_option("--prompt-cache-file", file,
                  "A file from `kiln cache-prompt`: the prompt continues after its tokens, whose K/V are loaded "
                  "instead of computed (made for this model, tokenizer and KV settings)");
}

std::optional<kvstore::PromptCache> PromptCacheArgs::load(const engine::LoadedModel& m) const {
  if (file.empty()) return std::nullopt;
  kvstore::PromptCache pc = kvstore::load_prompt_cache(file);
  kvstore::check_prompt_cache_model(pc, file, m.fingerprint, m.tokenizer_fingerprint);
  const int vocab = m.config.vocab_size;
  for (int32_t t : pc.tokens)
    if (t < 0 || t >= vocab) fail("prompt-cache", "{}: token id {} is outside this model's vocabulary", file, t);
  return pc;
}

void reserve_prompt_cache(const kvstore::PromptCache& pc, const engine::LoadedModel& m, int block_size,
                          engine::EngineConfig& ec) {
  const size_t need = engine::kv_bytes_per_block(*m.model, block_size) * (pc.n_cached_tokens() / block_size + 1);
  ec.prompt_cache_bytes = std::max(ec.prompt_cache_bytes, need);
}

int import_prompt_cache(const kvstore::PromptCache& pc, const std::string& path, engine::Engine& eng) {
  const kvstore::KvLayout layout = kvstore::KvLayout::of(eng.kv_cache());
  kvstore::check_prompt_cache_layout(pc, path, layout);
  kvstore::check_prompt_cache_rotation(pc, path, eng.kv_cache().max_kv_size);
  int n = 0;
  const std::vector<std::byte> data = kvstore::reblock(pc, layout, n);
  const int got = eng.import_prefix(pc.tokens, n, data);
  if (got < n) log::warn("{}: the prefix cache took {} of its {} blocks; raise --kv-cache-bytes", path, got, n);
  return got * layout.block_size;
}

std::string text_after_cache(const chat::Renderer& render, const std::string& text) {
  if (!render.chat_template()) return text;
  const std::string probe = render.render(OrderedJson::array({{{"role", "user"}, {"content", "<query>"}}})).text;
  const size_t at = probe.find("<query>");
  if (at == std::string::npos || text.compare(0, at, probe, 0, at) != 0)
    fail("prompt-cache", "the chat template does not write a user turn's content verbatim; use --ignore-chat-template");
  return text.substr(at);
}

}  // namespace kiln::cli
