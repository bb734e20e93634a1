// Launchers of the device sampler (sampling.cu): logit adjustments (bias and penalties) and the
// per-row draw (greedy, temperature, top-k, min-p, top-p) of Backend::sample_rows. Plain C++
// signatures so that host code validates and dispatches; all asynchronous on `stream`.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::backend::cuda {

// One row's parameters as the kernel reads them (a copy of backend::SampleParams, fixed layout).
struct DevSampleRow {
  float temperature, top_p, min_p;
  int32_t top_k;
  float repetition_penalty, presence_penalty, frequency_penalty;
  int32_t pad;
  double uniform;
};
// One (row, token) adjustment (a copy of backend::LogitAdjust).
struct DevLogitAdjust {
  int32_t row, token;
  float bias;
  int32_t in_context, n_generated;
};

// logits[row, token] += bias, then the repetition penalty (in context), then presence/frequency;
// entries name distinct (row, token) pairs, so they run in parallel.
void launch_adjust_logits(float* logits, int64_t vocab, const DevLogitAdjust* adjust, int64_t n_adjust,
                          const DevSampleRow* rows, cudaStream_t s);
// logits[rows[i], t] = -inf where bit t of words[i * n_words ...] is clear (TokenMasks' layout).
void launch_mask_logits(float* logits, int64_t vocab, const int32_t* rows, const uint32_t* words, int64_t n_words,
                        int64_t n_masks, cudaStream_t s);
// ids[r] = the token drawn for row r of logits f32 [n_rows, vocab] (one block per row).
void launch_sample_rows(const float* logits, int64_t n_rows, int64_t vocab, const DevSampleRow* rows, int32_t* ids,
                        cudaStream_t s);

}  // namespace kiln::backend::cuda
