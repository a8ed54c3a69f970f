#pragma once
// The current CUDA device's compute capability, for host-side kernel choices
// (sm_90 routes: staged rows, clusters). Torch-free.
#include <cuda_runtime.h>

#include <atomic>

namespace make_inplace::kernels {

// The current device's major compute capability, looked up once per device;
// 0 when it cannot be read (callers then keep to the routes every GPU has).
inline int compute_major() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> majors[kMaxDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return 0;
  int major = majors[device].load(std::memory_order_relaxed);
  if (major == 0 && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess) {
    majors[device].store(major, std::memory_order_relaxed);
  }
  return major;
}

}  // namespace make_inplace::kernels
