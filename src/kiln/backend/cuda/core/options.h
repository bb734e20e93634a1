// The CUDA backend's environment switches, parsed in one place (CudaOptions::from_env) and listed in
// one table (README.md, "Building with CUDA"). Each exists for a comparison whose question is still
// open or for diagnosis; the defaults are what ships. CudaBackend reads them at construction (so a
// test can make a profiling backend beside a plain one); PDL is read once per process.
#pragma once
#include <cstdint>
#include <string>

namespace kiln::backend::cuda {

struct CudaOptions {
  bool graphs = true;            // KILN_CUDA_GRAPHS=0: no CUDA graphs (every step eager)
  bool pdl = true;               // KILN_CUDA_PDL=0: no programmatic dependent launch
  bool fused = true;             // KILN_CUDA_FUSED=0: Backend's separate ops instead of the fused ones
  bool fused_decoder = true;     // KILN_CUDA_FUSED_DECODER=0: one-token 4-bit decode op by op
  bool moe = true;               // KILN_CUDA_MOE=0: MoE routing and experts through the host defaults
  int64_t l2_prefetch_mb = 4;    // KILN_L2_PREFETCH_MB=N: L2 prefetch of the next 4-bit GEMV (0: off)
  bool profile = false;          // KILN_CUDA_PROFILE=1: per-op device times (graphs off)
#ifdef KILN_CUDA_STAMPS
  std::string stamps_file;       // KILN_CUDA_STAMPS=FILE: the probe build's block stamps (probe/stamps.cu)
#endif

  static CudaOptions from_env();
};

// Whether launches use programmatic dependent launch (common.cuh's launch_pdl): CudaOptions::pdl of
// the environment at the first launch (the launchers have no backend to ask).
bool pdl_enabled();

}  // namespace kiln::backend::cuda
