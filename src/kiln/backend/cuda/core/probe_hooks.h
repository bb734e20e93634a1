// The probe builds' hooks in product code: macros that compile to nothing unless cmake was given
// -DKILN_CUDA_STAMPS=ON, which also builds probe/ (per-block %globaltimer stamps of the decode
// kernels, probe/stamps.cuh). Product code names the probe through these macros only.
#pragma once

#ifdef KILN_CUDA_STAMPS
namespace kiln::backend::cuda {
void stamps_start();  // probe/stamps.cu
}  // namespace kiln::backend::cuda
#define KILN_STAMPS_START() ::kiln::backend::cuda::stamps_start()
#ifdef __CUDACC__
#include "kiln/backend/cuda/probe/stamps.cuh"  // KILN_STAMP_SCOPE, KILN_STAMP
#endif
#else
#define KILN_STAMPS_START()
#define KILN_STAMP_SCOPE(site)
#define KILN_STAMP(k)
#endif
