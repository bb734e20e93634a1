// kiln perplexity: mlx_lm.perplexity over a local text file (--data-path): paragraphs (blank-line
// separated) are the documents, visited in a --seed order and tokenized until --num-samples rows of
// --sequence-length tokens are filled. Prints "Perplexity: X ± SE" and tokens/s; --kl-reference M
// also prints the mean and 99th-percentile KL(reference || model) of the next-token distributions.
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "kiln/cli/commands.h"
#include "kiln/cli/model_args.h"
#include "kiln/engine/kv_sizing.h"
#include "kiln/eval/perplexity.h"
#include "kiln/hub/model_card.h"

namespace kiln::cli {

namespace {

struct PerplexityArgs {
  ModelArgs model;
  std::string data_path, kl_reference;
  bool save_eval = false;
  int sequence_length = 512, num_samples = 256, batch_size = 8;
  uint64_t seed = 123;
};

std::vector<std::string> paragraphs(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("perplexity", "cannot read --data-path {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  std::vector<std::string> docs;
  size_t b = 0;
  while (b < text.size()) {
    size_t e = text.find("\n\n", b);
    if (e == std::string::npos) e = text.size();
    std::string d = text.substr(b, e - b);
    if (d.find_first_not_of(" \t\r\n") != std::string::npos) docs.push_back(std::move(d));
    b = e + 2;
  }
  if (docs.empty()) fail("perplexity", "--data-path {} holds no text", path);
  return docs;
}

void run_perplexity(const PerplexityArgs& a) {
  using Clock = std::chrono::steady_clock;
  if (a.save_eval && !std::filesystem::is_directory(a.model.model))
    fail("perplexity", "--save-eval writes into the model's folder: give --model a local folder");
  std::printf("Loading model from %s...\n", a.model.model.empty() ? "<embedded stories260K>" : a.model.model.c_str());
  auto m = a.model.load();
  std::unique_ptr<engine::LoadedModel> ref;
  if (!a.kl_reference.empty()) {
    ModelArgs ra = a.model;
    ra.model = a.kl_reference;
    ra.kv_bits = 0;  // the reference keeps a float KV cache: KL of --kv-bits against the same model
    std::printf("Loading KL reference from %s...\n", a.kl_reference.c_str());
    ref = ra.load();
  }
  const auto docs = paragraphs(a.data_path);
  const size_t want = a.num_samples > 0 ? static_cast<size_t>(a.num_samples) * a.sequence_length : SIZE_MAX;
  std::vector<int32_t> data;
  for (size_t i : eval::shuffled_order(docs.size(), a.seed)) {
    if (data.size() >= want) break;
    auto ids = m->tokenizer->encode(docs[i], true);
    data.insert(data.end(), ids.begin(), ids.end());
  }
  const auto rows = eval::cut_rows(data, a.sequence_length, a.num_samples);
  if (rows.empty())
    fail("perplexity", "{} has only {} tokens: not one row of --sequence-length {}", a.data_path, data.size(),
         a.sequence_length);
  std::printf("  Sequence length: %d\n  Loaded %zu samples\n", a.sequence_length, rows.size());
  // Each forward holds its rows' whole KV (16-token blocks, as eval allocates them): the batch is
  // cut to what --kv-cache-bytes, or the --gpu-memory-utilization budget, allows.
  int batch = a.batch_size;
  {
    backend::Backend& be = m->model->backend();
    const size_t act = dtype_size(be.act_dtype());
    engine::KvPoolRequest r;
    r.bytes_per_block = engine::kv_bytes_per_block(*m->model, 16);
    r.kv_cache_bytes = a.model.kv_cache_bytes;
    r.gpu_memory_utilization = a.model.gpu_memory_utilization;
    if (be.device_memory(&r.device_free, &r.device_total))
      r.activation_reserve = engine::activation_reserve_bytes(m->config, a.batch_size * a.sequence_length, act);
    batch = engine::rows_that_fit(r, (a.sequence_length + 15) / 16, a.batch_size);
    if (batch < a.batch_size) std::printf("  Batch size cut to %d to fit the KV cache\n", batch);
  }
  std::printf("\nEvaluating perplexity with batch size %d...\n", batch);
  eval::EvalOptions opt;
  opt.batch_size = batch;
  opt.progress = [](int done, int total) {
    std::fprintf(stderr, "  Processed %d/%d samples...\r", done, total);
    if (done == total) std::fputc('\n', stderr);
  };
  const auto t0 = Clock::now();
  const eval::TokenStats st = eval::evaluate(*m->model, rows, ref ? ref->model.get() : nullptr, opt);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const eval::Summary s = eval::summarize(st);
  std::printf("\n============================================================\nEVALUATION RESULTS\n"
              "============================================================\n");
  std::printf("Model: %s\n", m->path.c_str());
  std::printf("Perplexity: %.3f ± %.3f\n", s.perplexity, s.perplexity_se);
  if (ref) std::printf("KL divergence from %s: mean %.6f, p99 %.6f\n", a.kl_reference.c_str(), s.kl_mean, s.kl_p99);
  std::printf("Evaluation time: %.2f seconds\n", secs);
  std::printf("Tokens per second: %.0f\n", static_cast<double>(s.n_tokens) / std::max(secs, 1e-9));
  if (a.save_eval) {
    hub::EvalFigures f;
    f.perplexity = s.perplexity, f.perplexity_se = s.perplexity_se;
    if (ref) f.kl_mean = s.kl_mean, f.kl_p99 = s.kl_p99, f.reference = a.kl_reference;
    f.dataset = std::filesystem::path(a.data_path).filename().string() + ", " + std::to_string(rows.size()) + " x " +
                std::to_string(a.sequence_length) + " tokens";
    hub::write_eval_file(m->path, f);
    std::printf("Figures written to %s/%s (kiln upload's model card shows them)\n", m->path.c_str(), hub::kEvalFile);
  }
  std::printf("\nDataset statistics:\n  Total samples: %zu\n  Total tokens: %zu\n", rows.size(),
              rows.size() * static_cast<size_t>(a.sequence_length));
}

}  // namespace

void add_perplexity(CLI::App& app) {
  auto a = std::make_shared<PerplexityArgs>();
  CLI::App* cmd = app.add_subcommand("perplexity", "Perplexity of a model on a text file (and KL from a reference)");
  a->model.add_to(cmd);
  cmd->add_option("--data-path", a->data_path, "Text file; paragraphs (blank-line separated) are the documents")
      ->required();
  cmd->add_option("--sequence-length", a->sequence_length, "Tokens per sample")->default_val(512);
  cmd->add_option("--num-samples", a->num_samples, "Samples to evaluate (-1: all)")->default_val(256);
  cmd->add_option("--batch-size", a->batch_size, "Samples per forward")->default_val(8)->check(CLI::PositiveNumber);
  cmd->add_option("--seed", a->seed, "Seed of the document order")->default_val(123);
  cmd->add_option("--kl-reference", a->kl_reference,
                  "Reference model (e.g. the float original): also report KL(reference || model); it runs with a float "
                  "KV cache, so --kv-bits with the same model as reference measures the quantized cache");
  cmd->add_flag("--save-eval", a->save_eval,
               "Write the figures to the model folder's kiln_eval.json (kiln upload's model card shows them)");
  cmd->callback([a] { run_perplexity(*a); });
}

}  // namespace kiln::cli
