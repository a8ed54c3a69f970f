#pragma once
// What the in-place square matmul kernels share (square_matmul_wgmma and
// square_matmul_ffma): groups of CTAs own 128-row blocks of x, and a CTA may
// write its results over a block only once every CTA of its group has
// finished reading it. The groups meet on one counter per block, at the
// cooperative grid's barrier once a round, or are thread-block clusters
// (wgmma). Every CTA of a group must be resident at once, hence the
// cooperative launch (or the cluster launch).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace make_inplace::kernels::row_block_groups {

// One thread per CTA, once its reads of the block are done: they happen
// before the add (release), so a CTA that sees the full count may write.
__device__ __forceinline__ void count_done(uint32_t* counter) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
}

__device__ __forceinline__ void wait_count(const uint32_t* counter, uint32_t target) {
  uint32_t seen;
  while (true) {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    if (seen >= target) break;
    __nanosleep(32);
  }
}

// The cooperative grid's barrier, arrived at and awaited by one thread of
// each CTA: cooperative_groups' grid sync takes every thread of the CTA,
// which would stall a warp-specialized kernel's loads and tensor work. The
// word is the one the driver gives every cooperative launch (so no memory
// of ours), updated as cooperative_groups does: each CTA adds 1, CTA 0 adds
// 2^31 - (CTAs - 1), so its top bit flips once all have arrived.
__device__ __forceinline__ uint32_t* grid_barrier_word() {
  return &cooperative_groups::details::get_grid_workspace()->barrier;
}

// Returns the word as it was before this CTA's arrival, for grid_wait.
// Everything this CTA did before happens before the add (release).
__device__ __forceinline__ uint32_t grid_arrive(uint32_t* word) {
  const uint32_t add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
  uint32_t old;
  asm volatile("atom.add.release.gpu.u32 %0, [%1], %2;" : "=r"(old) : "l"(word), "r"(add) : "memory");
  return old;
}

__device__ __forceinline__ void grid_wait(const uint32_t* word, uint32_t old) {
  uint32_t seen;
  while (true) {
    asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(seen) : "l"(word) : "memory");
    if (((seen ^ old) & 0x80000000u) != 0) break;
    __nanosleep(32);
  }
}

// A launch of `grid` CTAs: cooperative (all resident) when cluster_ctas is
// 0, else in clusters of cluster_ctas. attr must outlive the launch.
inline cudaLaunchConfig_t launch_config(int grid, int threads, int smem_bytes, int cluster_ctas,
                                        cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  if (cluster_ctas == 0) {
    attr->id = cudaLaunchAttributeCooperative;
    attr->val.cooperative = 1;
  } else {
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = cluster_ctas;
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
  }
  config.attrs = attr;
  config.numAttrs = 1;
  return config;
}

}  // namespace make_inplace::kernels::row_block_groups
