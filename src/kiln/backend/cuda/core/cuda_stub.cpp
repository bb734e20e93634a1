// The CUDA entry points in a build without CUDA (KILN_CUDA=OFF): no device is ever available,
// and asking for the backend fails by name with what to do.
#include "kiln/backend/backend.h"

namespace kiln::backend {

std::unique_ptr<Backend> make_cuda_backend(int device) {
  fail("cuda", "this kiln was built without CUDA; rebuild with -DKILN_CUDA=ON (needs nvcc) or use --device cpu");
}

bool cuda_device_available() { return false; }

}  // namespace kiln::backend
