// CudaOptions::from_env: the one reader of the CUDA backend's environment switches (options.h).
// A boolean switch turns its default off with "0" (KILN_CUDA_PROFILE: any value but "0" turns it on).
#include "kiln/backend/cuda/core/options.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace kiln::backend::cuda {

namespace {

// on unless the variable is "0"
bool on_unless_zero(const char* name) {
  const char* e = std::getenv(name);
  return !(e && std::strcmp(e, "0") == 0);
}

}  // namespace

CudaOptions CudaOptions::from_env() {
  CudaOptions o;
  o.graphs = on_unless_zero("KILN_CUDA_GRAPHS");
  o.pdl = on_unless_zero("KILN_CUDA_PDL");
  o.fused = on_unless_zero("KILN_CUDA_FUSED");
  o.fused_decoder = on_unless_zero("KILN_CUDA_FUSED_DECODER");
  o.moe = on_unless_zero("KILN_CUDA_MOE");
  if (const char* e = std::getenv("KILN_L2_PREFETCH_MB")) o.l2_prefetch_mb = std::max(0ll, std::atoll(e));
  const char* prof = std::getenv("KILN_CUDA_PROFILE");
  o.profile = prof && std::strcmp(prof, "0") != 0;
#ifdef KILN_CUDA_STAMPS
  if (const char* e = std::getenv("KILN_CUDA_STAMPS")) o.stamps_file = e;
#endif
  return o;
}

bool pdl_enabled() {
  static const bool on = CudaOptions::from_env().pdl;
  return on;
}

}  // namespace kiln::backend::cuda
