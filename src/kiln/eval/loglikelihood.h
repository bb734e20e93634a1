// lm-evaluation-harness's scoring requests on a model's forward (through the engine's ModelRunner):
// loglikelihood(context, continuation) = sum over the continuation's tokens of log p(token | all
// before it), and whether every one of them is the greedy pick; loglikelihood_rolling splits a
// document into lm-eval's rolling windows (each a loglikelihood request) over the model's context.
// Requests with the same context are grouped: the context's K/V up to its last whole 16-token
// block is computed once into blocks the group's requests share (each request then runs only its
// context tail and continuation), and groups are batched, up to batch_size requests per forward.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kiln/model/model.h"

namespace kiln::eval {

struct LoglikelihoodRequest {
  std::vector<int32_t> context;       // at least one token (lm-eval puts the prefix token in an empty one)
  std::vector<int32_t> continuation;  // at least one token
};

struct LoglikelihoodResult {
  double logprob = 0;     // sum of log p(continuation token | before)
  bool is_greedy = true;  // every continuation token is the argmax of its row
};

struct ScoreOptions {
  int batch_size = 16;          // requests per forward
  bool group_prefixes = true;   // share a context's K/V across the requests that have it
  int max_length = 0;           // tokens per forward (0: the model's max_position_embeddings, else 2048)
  // Called after each forward with (requests done, requests total).
  std::function<void(size_t, size_t)> progress;
};

// One result per request, in order. Like lm-eval, context + continuation longer than max_length + 1
// loses tokens from the left (the continuation keeps at most max_length). Throws [eval] on an empty
// context or continuation or a token id outside the vocabulary.
std::vector<LoglikelihoodResult> loglikelihood(model::Model& m, std::span<const LoglikelihoodRequest> reqs,
                                               const ScoreOptions& opt = {});

// max_length when opt.max_length is 0.
int default_max_length(const model::ModelConfig& c);

// lm-eval's get_rolling_token_windows(tokens, prefix_token, max_seq_len, context_len = 1) with
// make_disjoint_window applied: the first window predicts tokens[0, min(n, L)) from the prefix
// token, later windows the next up to L tokens, each with the L-token window before its end as
// context minus the predicted part. Summing the windows' loglikelihoods scores every token once.
std::vector<LoglikelihoodRequest> rolling_windows(std::span<const int32_t> tokens, int32_t prefix_token,
                                                  int max_seq_len);

}  // namespace kiln::eval
