#pragma once
// Turns a kernel wrapper's cudaError_t into an error that names the op. The
// wrappers configure (shared-memory limits, occupancy) before their first
// launch, so a failure reported here has written nothing.
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

namespace make_inplace {

inline void check_launch(cudaError_t err, const char* op) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a non-sticky launch error for the next call
  TORCH_CHECK(false, "make_inplace.", op, ": CUDA kernel launch failed: ",
              cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

}  // namespace make_inplace
