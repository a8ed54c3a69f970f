#pragma once
// The copy half of square_matmul_'s panel route: the GEMM of a panel of rows
// writes its results into workspace blocks (block b holds the panel's rows
// [b * rows_per_block, (b + 1) * rows_per_block)), and this kernel moves them
// over the panel's rows in x, adding the bias on the way. Torch-free: raw
// pointers, sizes and a stream.
#include <cuda_runtime.h>

#include <cstdint>

#include "make_inplace/kernels/scalar_kind.h"
#include "make_inplace/square_matmul_tuning.h"

namespace make_inplace::kernels {

// Workspace blocks of one panel, passed by value to the kernel.
struct PanelBlocks {
  static constexpr int kMax = square_matmul::kMaxPanelBlocks;
  const void* ptr[kMax];
};

// dst: the panel's first row in x (rows x n, row-major); blocks.ptr[b] holds
// rows_per_block rows (the last block fewer when rows is not a multiple).
// bias (n elements or null) is added in float32 (float64 for doubles) to the
// GEMM's rounded result. Returns the launch error; cudaErrorInvalidValue for
// more than PanelBlocks::kMax blocks.
cudaError_t copy_panel_blocks(ScalarKind kind, void* dst, const PanelBlocks& blocks,
                              int block_count, int64_t rows_per_block, int64_t rows,
                              int64_t n, const void* bias, cudaStream_t stream);

// Writes cuBLAS's device pointer array for a batched GEMM without a host
// round trip: dst[i] = fixed.ptr[i] for i < fixed_count, then
// dst[fixed_count + j] = first + j * step_bytes for j < count. One small
// launch on `stream`; returns its error.
cudaError_t write_panel_pointers(const void** dst, const PanelBlocks& fixed, int fixed_count,
                                 const void* first, int64_t step_bytes, int64_t count,
                                 cudaStream_t stream);

}  // namespace make_inplace::kernels
