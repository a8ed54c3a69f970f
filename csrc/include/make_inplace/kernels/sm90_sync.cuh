#pragma once
// Hopper (sm_90) synchronization primitives as thin PTX wrappers, shared by
// the staged row-wise kernels (staged_rows.cuh) and the wgmma square matmul:
// shared-memory addresses, thread-block clusters and mbarriers. Defined only
// in device passes for sm_90 and later; callers guard their use the same way.
#include <cuda_runtime.h>

#include <cstdint>

namespace make_inplace::kernels::sm90 {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ unsigned cluster_size() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster: what each wrote to shared memory
// (its own or a peer's) before it is visible to the others after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
}

// After the barriers' init, before any other CTA of the cluster or the copy
// engine uses them.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
}

// Arrives on the barrier at the same offset in CTA `cta` of the cluster,
// releasing this thread's prior memory operations at cluster scope.
__device__ __forceinline__ void mbar_arrive_in_cta(uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}" ::"r"(shared_address(bar)),
      "r"(cta)
      : "memory");
}

// Waits for the barrier's phase of this parity to complete; kCluster
// acquires at cluster scope (arrivals from other CTAs of the cluster).
template <bool kCluster = false>
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    if (kCluster) {
      asm volatile(
          "{\n .reg .pred ready;\n"
          " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 ready, [%1], %2;\n"
          " selp.u32 %0, 1, 0, ready;\n}"
          : "=r"(done)
          : "r"(shared_address(bar)), "r"(parity)
          : "memory");
    } else {
      asm volatile(
          "{\n .reg .pred ready;\n"
          " mbarrier.try_wait.parity.shared::cta.b64 ready, [%1], %2;\n"
          " selp.u32 %0, 1, 0, ready;\n}"
          : "=r"(done)
          : "r"(shared_address(bar)), "r"(parity)
          : "memory");
    }
  }
}

#endif  // __CUDA_ARCH__ >= 900

}  // namespace make_inplace::kernels::sm90
