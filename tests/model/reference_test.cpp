// Oracle tests: every decoder family against Hugging Face transformers' float32 outputs in
// ../shared/models/*/reference.json — logits at every prompt position, then greedy tokens
// decoded one at a time through the paged KV cache.
// Tolerance: max |logit - ref| <= 1e-4 * (the logit range of that row) + 1e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <span>

#include "kiln/base/json.h"
#include "kiln/model/model.h"
#include "../model_test_util.h"

using namespace kiln;

namespace {

int32_t argmax_of(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

using Loaded = test::LoadedModel;
std::unique_ptr<Loaded> load(const std::string& dir) { return test::load_model_dir(dir); }

using test::run_chunk;

double row_range(const Json& row) {
  double lo = 1e30, hi = -1e30;
  for (auto& v : row) lo = std::min(lo, v.get<double>()), hi = std::max(hi, v.get<double>());
  return hi - lo;
}

void check_model(const std::string& name, const char* ids_key, const char* logits_key, const char* greedy_key) {
  std::string dir = std::string(KILN_SHARED_DIR) + "/models/" + name;
  Json ref = read_json_file(dir + "/reference.json");
  auto l = load(dir);
  std::vector<int32_t> ids = ref[ids_key].get<std::vector<int32_t>>();
  std::vector<int32_t> greedy = ref[greedy_key].get<std::vector<int32_t>>();
  const int n = static_cast<int>(ids.size()), V = l->cfg.vocab_size;
  auto kv = model::KvCache::allocate(*l->be, l->cfg, (static_cast<int>(greedy.size()) + 15) / 16 * 16 / 4 + 1, 4);

  // Prefill in two chunks (exercises chunked prefill over the paged cache), all logits.
  int split = n / 2;
  Tensor a = run_chunk(*l->m, kv, ids, 0, split, true);
  Tensor b = run_chunk(*l->m, kv, ids, split, n, true);
  double worst = 0;
  for (int p = 0; p < n; ++p) {
    const float* got = p < split ? a.ptr<float>() + p * V : b.ptr<float>() + (p - split) * V;
    const Json& row = ref[logits_key][p];
    double tol = 1e-4 * row_range(row) + 1e-5, err = 0;
    for (int v = 0; v < V; ++v) err = std::max(err, std::abs(got[v] - row[v].get<double>()));
    worst = std::max(worst, err / tol);
    ASSERT_LE(err, tol) << name << " position " << p;
  }
  std::printf("%s: worst logit error %.3f of tolerance\n", name.c_str(), worst);

  // Greedy continuation, one token per step.
  std::vector<int32_t> seq = ids;
  Tensor last = b;
  int32_t next = argmax_of({last.ptr<float>() + (n - split - 1) * V, static_cast<size_t>(V)});
  while (seq.size() < greedy.size()) {
    seq.push_back(next);
    Tensor lg = run_chunk(*l->m, kv, seq, static_cast<int>(seq.size()) - 1, static_cast<int>(seq.size()), false);
    next = argmax_of({lg.ptr<float>(), static_cast<size_t>(V)});
  }
  EXPECT_EQ(seq, greedy) << name;
}

}  // namespace

TEST(Reference, Stories260KPrompt) { check_model("stories260K", "prompt_ids", "prompt_logits", "greedy_ids"); }

TEST(Reference, Stories260KFromBos) {
  std::string dir = std::string(KILN_SHARED_DIR) + "/models/stories260K";
  Json ref = read_json_file(dir + "/reference.json");
  auto l = load(dir);
  auto want = ref["bos_greedy_ids"].get<std::vector<int32_t>>();
  auto kv = model::KvCache::allocate(*l->be, l->cfg, 32, 8);
  std::vector<int32_t> seq = {want[0]};
  while (seq.size() < want.size()) {
    Tensor lg = run_chunk(*l->m, kv, seq, static_cast<int>(seq.size()) - 1, static_cast<int>(seq.size()), false);
    seq.push_back(argmax_of({lg.ptr<float>(), static_cast<size_t>(l->cfg.vocab_size)}));
  }
  EXPECT_EQ(seq, want);
}

class TinyModels : public ::testing::TestWithParam<std::string> {};
TEST_P(TinyModels, LogitsAndGreedy) { check_model(GetParam(), "input_ids", "logits", "greedy_ids"); }
INSTANTIATE_TEST_SUITE_P(All, TinyModels,
                         ::testing::Values("tiny-llama", "tiny-llama3_rope_scaled", "tiny-mistral", "tiny-qwen2", "tiny-qwen3",
                                           "tiny-phi3", "tiny-gemma2", "tiny-gemma3_text", "tiny-qwen3_moe", "tiny-mixtral"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& c : s)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });
