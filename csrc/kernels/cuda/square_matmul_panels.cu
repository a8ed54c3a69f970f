// Moves a panel's GEMM results from the workspace blocks over the panel's rows
// in x (square_matmul_panels.h). Memory-bound: each result byte is read once
// and written once, 16 bytes at a time when the rows allow it. blockIdx.y is
// the workspace block; within it the copy is one contiguous run of elements.
#include "make_inplace/kernels/cuda_pack.cuh"
#include "make_inplace/kernels/square_matmul_panels.h"

namespace make_inplace::kernels {
namespace {

using namespace cuda_detail;

constexpr int kThreads = 256;

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    copy_blocks_kernel(T* __restrict__ dst, PanelBlocks blocks, int64_t rows_per_block,
                       int64_t rows, int64_t n, const T* __restrict__ bias, bool bias_packed) {
  const int b = blockIdx.y;
  const int64_t first_row = b * rows_per_block;
  const int64_t count = rows - first_row < rows_per_block ? rows - first_row : rows_per_block;
  const int64_t packs = count * n / V;  // V divides n
  const T* src = static_cast<const T*>(blocks.ptr[b]);
  T* out = dst + first_row * n;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs;
       p += step) {
    Pack<T, V> v = *reinterpret_cast<const Pack<T, V>*>(src + p * V);
    if (bias != nullptr) {
      // The column of the pack: a 32-bit remainder where it fits (a 64-bit
      // one costs dozens of instructions per 16 bytes moved).
      const int64_t col = p < (int64_t{1} << 32) && n / V < (int64_t{1} << 32)
                              ? static_cast<uint32_t>(p) % static_cast<uint32_t>(n / V) * int64_t{V}
                              : p % (n / V) * V;
      const Pack<T, V> bv = load_pack<T, V>(bias + col, 1, bias_packed);
#pragma unroll
      for (int e = 0; e < V; ++e) v.v[e] = from_acc<T>(to_acc(v.v[e]) + to_acc(bv.v[e]));
    }
    store_pack<T, V>(out + p * V, v);
  }
}

template <typename T, int V>
cudaError_t launch(void* dst, const PanelBlocks& blocks, int block_count,
                   int64_t rows_per_block, int64_t rows, int64_t n, const void* bias,
                   cudaStream_t stream) {
  const int64_t packs_per_block = rows_per_block * n / V;
  const int64_t per_block_grid = std::max<int64_t>(
      1, std::min<int64_t>((packs_per_block + kThreads - 1) / kThreads,
                           int64_t{sm_count()} * 8 / block_count));
  const dim3 grid(static_cast<unsigned>(per_block_grid), static_cast<unsigned>(block_count));
  copy_blocks_kernel<T, V><<<grid, kThreads, 0, stream>>>(
      static_cast<T*>(dst), blocks, rows_per_block, rows, n, static_cast<const T*>(bias),
      V > 1 && bias != nullptr && aligned16(bias));
  return cudaGetLastError();
}

__global__ void write_pointers_kernel(const void** dst, PanelBlocks fixed, int fixed_count,
                                      const char* first, int64_t step_bytes, int64_t count) {
  const int64_t total = fixed_count + count;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = i < fixed_count ? fixed.ptr[i] : first + (i - fixed_count) * step_bytes;
  }
}

}  // namespace

cudaError_t write_panel_pointers(const void** dst, const PanelBlocks& fixed, int fixed_count,
                                 const void* first, int64_t step_bytes, int64_t count,
                                 cudaStream_t stream) {
  if (fixed_count < 0 || fixed_count > PanelBlocks::kMax || count < 0) return cudaErrorInvalidValue;
  const int64_t total = fixed_count + count;
  if (total == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((total + kThreads - 1) / kThreads, 64));
  write_pointers_kernel<<<grid, kThreads, 0, stream>>>(
      dst, fixed, fixed_count, static_cast<const char*>(first), step_bytes, count);
  return cudaGetLastError();
}

cudaError_t copy_panel_blocks(ScalarKind kind, void* dst, const PanelBlocks& blocks,
                              int block_count, int64_t rows_per_block, int64_t rows,
                              int64_t n, const void* bias, cudaStream_t stream) {
  if (block_count < 1 || block_count > PanelBlocks::kMax || rows_per_block < 1 || rows < 1 ||
      rows > block_count * rows_per_block) {
    return cudaErrorInvalidValue;
  }
  return dispatch_kind(kind, [&](auto zero) {
    using T = decltype(zero);
    constexpr int V = kVec16<T>;
    // 16-byte packs need every block's run and the panel's rows to start on
    // 16 bytes: true when x is aligned and V divides n (blocks come from the
    // allocator, 512-byte aligned, and hold whole rows).
    bool packed = n % V == 0 && aligned16(dst);
    for (int b = 0; b < block_count; ++b) packed = packed && aligned16(blocks.ptr[b]);
    return packed ? launch<T, V>(dst, blocks, block_count, rows_per_block, rows, n, bias, stream)
                  : launch<T, 1>(dst, blocks, block_count, rows_per_block, rows, n, bias, stream);
  });
}

}  // namespace make_inplace::kernels
