#pragma once
// Rows of at most a warp each, walked row after row by each thread group.
//
// Why: a row of 128 16-bit columns is 16 elements for each of 8 threads. A
// kernel with one row per thread group spent more instructions finding its
// row, loading w and b and starting up than on the elements, and a warp had
// nothing in flight from its reduction to its exit. Here each group of TPR
// threads takes row after row (stride: the grid's rows): the next row's
// vectors are loaded before the current row is reduced, and per-column values
// (w, b) stay in registers across rows.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "make_inplace/kernels/rowwise_cuda.cuh"

namespace make_inplace::kernels::rowwise {

// Rows a kSmallBlock-thread CTA of TPR-thread groups holds at once.
template <int TPR>
constexpr int kShortRowsPerCta = kSmallBlock / TPR;

// Calls body(buf, row, active) for each row of x (rows x n, 16-byte vectors
// of T) that this thread's group walks, with buf holding the thread's NV
// vectors as 32-bit words: columns (k * TPR + lane) * VEC for k < NV, those at
// or past n left unloaded. Every lane of a warp calls body the same number of
// times (rows past the end with active false), so body may shuffle within its
// group. Words, not vectors of T: copying 16-bit elements from one buffer to
// the next cost a byte permute per element.
// KEEP_LINES loads under an L2 evict_last policy (global16.cuh): H200, 0.5-1%
// faster for layer_norm_, 5% slower for softmax_ (docs/rowwise_tuning.md).
template <int TPR, int NV, bool KEEP_LINES, typename T, typename Body>
__device__ __forceinline__ void walk_short_rows(const T* x, int64_t rows, int n, Body&& body) {
  static_assert(TPR >= 1 && TPR <= 32 && 32 % TPR == 0, "a row's threads share a warp");
  constexpr int VEC = 16 / sizeof(T);
  const int lane = static_cast<int>(threadIdx.x) % TPR;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kShortRowsPerCta<TPR>;
  int64_t row = static_cast<int64_t>(blockIdx.x) * kShortRowsPerCta<TPR> + threadIdx.x / TPR;
  // The warp goes on while its first row does.
  int64_t warp_row = row - (threadIdx.x % 32) / TPR;
  const auto load = [&](uint4(&buf)[NV], int64_t r) {
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int col = (k * TPR + lane) * VEC;
      if (r < rows && col < n) buf[k] = load_global_16<KEEP_LINES, uint4>(x + r * n + col);
    }
  };
  uint4 buf[NV];
  load(buf, row);
  for (; warp_row < rows; warp_row += stride, row += stride) {
    uint4 next[NV];
    load(next, row + stride);
    body(buf, row, row < rows);
#pragma unroll
    for (int k = 0; k < NV; ++k) buf[k] = next[k];
  }
}

// CTAs for walk_short_rows' kernel: one per kShortRowsPerCta rows, capped
// at those resident at once where `persistent` (groups then take several rows
// each). Measured on an H200 (docs/notes/rowwise.md): the cap wins for 16-bit
// rows, whose kernels hold more registers; float32 softmax rows ran faster
// with a CTA per rows.
template <int TPR, typename... Params>
cudaError_t short_rows_grid(void (*kernel)(Params...), int64_t rows, bool persistent,
                            unsigned* grid) {
  int64_t need = (rows + kShortRowsPerCta<TPR> - 1) / kShortRowsPerCta<TPR>;
  if (persistent) {
    int64_t ctas = 0;
    const cudaError_t err = resident_ctas(kernel, kSmallBlock, 0, &ctas);
    if (err != cudaSuccess) return err;
    if (ctas < need) need = ctas;
  }
  if (need > kMaxGridX) need = kMaxGridX;  // the walk covers the rest
  *grid = static_cast<unsigned>(need);
  return cudaSuccess;
}

// Calls f(std::integral_constant<int, TPR>{}) for a power-of-two tpr up to a
// warp; false for any other.
template <typename F>
bool with_short_group(int tpr, F&& f) {
  switch (tpr) {
    case 1: f(std::integral_constant<int, 1>{}); return true;
    case 2: f(std::integral_constant<int, 2>{}); return true;
    case 4: f(std::integral_constant<int, 4>{}); return true;
    case 8: f(std::integral_constant<int, 8>{}); return true;
    case 16: f(std::integral_constant<int, 16>{}); return true;
    case 32: f(std::integral_constant<int, 32>{}); return true;
  }
  return false;
}

}  // namespace make_inplace::kernels::rowwise
