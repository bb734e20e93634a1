// lm-evaluation-harness's generate_until requests: a continuation of a context, sampled (greedy by
// default) until one of the stop strings appears, an EOS token, or max_gen_toks tokens; the text
// is cut before the first stop string. Requests run batch_size at a time, each its own sequence
// of one ragged forward per step through the engine's ModelRunner, sampled on the host.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kiln/engine/sampler.h"
#include "kiln/model/model.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::eval {

struct GenerateRequest {
  std::vector<int32_t> context;    // at least one token
  std::vector<std::string> until;  // stop strings
  int max_gen_toks = 256;
};

struct GenerateOptions {
  int batch_size = 16;
  int max_length = 0;  // context + generation (0: the model's); a longer context loses tokens from the left
  engine::SamplingParams sampling;  // temperature 0: greedy; the seed + the request's index seeds each
  std::vector<int32_t> eos_ids;
  std::function<void(size_t, size_t)> progress;  // (requests done, total) after each batch
};

// The generated text of each request, in order, cut before the first stop string.
std::vector<std::string> generate_until(model::Model& m, const tokenizer::Tokenizer& tok,
                                        std::span<const GenerateRequest> reqs, const GenerateOptions& opt = {});

// text cut before the earliest occurrence of any of until (unchanged when none occurs).
std::string cut_at_stop(const std::string& text, std::span<const std::string> until);

}  // namespace kiln::eval
