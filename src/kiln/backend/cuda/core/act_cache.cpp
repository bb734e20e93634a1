// CudaBackend's activation cache (Impl::qx_cache): the 4-bit GEMV's quantized copy (qx) of an
// activation, written beside it by the kernel of the op that produced it, found again by the
// activation's address and shape, and ended by the launch gates (Impl::skip*) of the ops that may
// write it.
#include <algorithm>

#include "kiln/backend/cuda/core/cuda_impl.h"
#include "kiln/backend/cuda/quant/qkernels.h"

namespace kiln::backend::cuda {

// Why a cached qx is never stale:
//  - in-place and overwriting ops: every op passes a gate before it launches, and the gate ends the
//    entries of every activation it may write (all of them, unless the op names its outputs); so an
//    entry seen by a GEMV was made by the last op that wrote those bytes;
//  - arena reuse: an allocation ends the entries its bytes overlap (a new tensor at a reused address,
//    within a step or not), and begin_step / end_step end them all (the next step's arena hands out
//    the same addresses); the entry holds its qx buffer, so that cannot be handed out meanwhile;
//  - graph capture and replay: all of this is host work before the gate, driven by the ops' calls and
//    their tensors' addresses and shapes only, which a replay repeats exactly (end_graph checks its
//    allocations): the replay's producers allocate the same qx, its GEMVs find the same entries, and
//    the graph's kernels write and read them as captured.

void CudaBackend::Impl::forget_qx(const void* p, size_t bytes) {
  const auto* b = static_cast<const char*>(p);
  std::erase_if(qx_cache, [&](const QxEntry& e) {
    const auto* d = static_cast<const char*>(e.data);
    return d < b + bytes && b < d + e.n * e.in * 2;
  });
}

bool CudaBackend::Impl::skip() {
  qx_cache.clear();
  return mode == Mode::replay;
}

bool CudaBackend::Impl::skip(const Tensor& written) {
  forget_qx(written.data, written.nbytes());
  return mode == Mode::replay;
}

bool CudaBackend::Impl::skip(std::span<Tensor* const> written) {
  for (const Tensor* t : written) forget_qx(t->data, t->nbytes());
  return mode == Mode::replay;
}

bool CudaBackend::Impl::skip_producing(Tensor& out, QxOut& qx, bool want) {
  qx_cache.clear();  // first, so that the qx released here can be handed out again below
  qx = {};
  if (want && in_step && q4_group > 0 && out.dtype == DType::bf16 && !out.empty() &&
      out.rows() <= qgemv_max_tokens(4) && out.cols() % 32 == 0 && reinterpret_cast<uintptr_t>(out.data) % 16 == 0) {
    const int64_t n = out.rows(), in = out.cols();
    QxEntry e{out.data, n, in, q4_group, arena_alloc(DType::u8, {q4_qx_bytes(n, in, q4_group)})};
    qx = QxOut{e.qx.data, qx_layout(n, in, q4_group), q4_group};
    qx_cache.push_back(std::move(e));
  }
  return mode == Mode::replay;
}

const Tensor* CudaBackend::Impl::cached_qx(const Tensor& x, int64_t n, int64_t in, int group_size) const {
  if (x.dtype != DType::bf16) return nullptr;
  for (const QxEntry& e : qx_cache)
    if (e.data == x.data && e.n == n && e.in == in && e.group_size == group_size) return &e.qx;
  return nullptr;
}

bool CudaBackend::has_cached_qx(const Tensor& x) const {
  return impl_->cached_qx(x, x.rows(), x.cols(), impl_->q4_group) != nullptr;
}

}  // namespace kiln::backend::cuda
