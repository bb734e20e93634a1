// CudaBackend::sample_rows (the device sampler's checks, parameter upload and dispatch; kernels in
// sampling.cu) and device_memory (what the engine budgets the KV pool from).
#include <cstring>

#include "kiln/backend/cuda/core/cuda_impl.h"
#include "kiln/backend/cuda/ops/sampling.h"
#include "kiln/backend/sampling.h"

namespace kiln::backend::cuda {

namespace {

// A host array of trivially copyable records as a device buffer (i32 words: both records are
// multiples of 4 bytes), through the backend's upload (staging and arena inside a step).
template <typename T>
Tensor upload_records(CudaBackend& be, const std::vector<T>& v) {
  static_assert(sizeof(T) % 4 == 0);
  Tensor h = Tensor::host(DType::i32, {static_cast<int64_t>(std::max<size_t>(v.size(), 1) * sizeof(T) / 4)});
  if (!v.empty()) std::memcpy(h.data, v.data(), v.size() * sizeof(T));
  return be.upload(h);
}

}  // namespace

void CudaBackend::sample_rows(Tensor& logits, const std::vector<SampleParams>& params,
                              const std::vector<LogitAdjust>& adjust, Tensor& ids, const TokenMasks& masks) {
  Impl& im = *impl_;
  if (logits.device != Device::cuda || logits.dtype != DType::f32 || logits.ndim() != 2)
    fail("cuda", "sample_rows: logits must be float32 [rows, vocab] on the device, got {} {}", dtype_name(logits.dtype),
         shape_str(logits.shape));
  if (ids.device != Device::cuda || ids.dtype != DType::i32 || ids.numel() != logits.dim(0))
    fail("cuda", "sample_rows: ids must be int32 [{}] on the device, got {} {}", logits.dim(0), dtype_name(ids.dtype),
         shape_str(ids.shape));
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  if (static_cast<int64_t>(params.size()) != rows)
    fail("cuda", "sample_rows: {} parameter sets for {} rows", params.size(), rows);
  if (vocab <= 0 || vocab > INT32_MAX) fail("cuda", "sample_rows: vocab of {} tokens", vocab);
  // Uploads are eager copies: a captured graph would replay stale parameters.
  if (im.mode != Impl::Mode::eager) fail("cuda", "sample_rows: call it outside a graph region (after end_graph)");
  std::vector<DevSampleRow> dr(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const SampleParams& p = params[i];
    if (!(p.uniform >= 0.0 && p.uniform < 1.0)) fail("cuda", "sample_rows: row {}: uniform {} is not in [0, 1)", i, p.uniform);
    dr[i] = DevSampleRow{p.temperature,        p.top_p,           p.min_p,
                         p.top_k,              p.repetition_penalty, p.presence_penalty,
                         p.frequency_penalty,  0,                 p.uniform};
  }
  std::vector<DevLogitAdjust> da(adjust.size());
  for (size_t i = 0; i < adjust.size(); ++i) {
    const LogitAdjust& a = adjust[i];
    if (a.row < 0 || a.row >= rows) fail("cuda", "sample_rows: adjustment {} names row {} of {}", i, a.row, rows);
    da[i] = DevLogitAdjust{a.row, a.token, a.bias, a.in_context, a.n_generated};
  }
  check_masks("cuda", masks, rows, vocab);
  im.skip();  // the write fence (never a replay: checked above)
  if (rows == 0) return;
  Tensor dp = upload_records(*this, dr), dadj = upload_records(*this, da);
  Tensor dmr = upload_records(*this, masks.rows), dmw = upload_records(*this, masks.words);  // (~16 KB a row at 128k)
  ProfScope ps(im, "sample_rows");
  const auto* rp = static_cast<const DevSampleRow*>(dp.data);
  launch_mask_logits(logits.ptr<float>(), vocab, static_cast<const int32_t*>(dmr.data),
                     static_cast<const uint32_t*>(dmw.data), masks.n_words, static_cast<int64_t>(masks.rows.size()),
                     im.stream);
  launch_adjust_logits(logits.ptr<float>(), vocab, static_cast<const DevLogitAdjust*>(dadj.data),
                       static_cast<int64_t>(da.size()), rp, im.stream);
  launch_sample_rows(logits.ptr<float>(), rows, vocab, rp, ids.ptr<int32_t>(), im.stream);
}

bool CudaBackend::device_memory(size_t* free_bytes, size_t* total_bytes) const {
  CUDA_CHECK(cudaSetDevice(impl_->device));
  CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
  return true;
}

}  // namespace kiln::backend::cuda
