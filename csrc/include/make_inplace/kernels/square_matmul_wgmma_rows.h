#pragma once
// The Hopper (sm_90a) in-place square matmul for 16-bit types and rows of at
// most 512 columns: x[rows, n] <- x @ w (+ bias), or x @ w^T with transpose.
// Each CTA owns whole 64-row blocks: its two consumer warpgroups compute the
// block's 256-column halves, so the block may be written back as soon as the
// CTA's own last k-step is done. No CTA waits on another, and no device
// memory is used beyond x, w and bias. Torch-free: raw pointers, sizes and a
// stream.
#include <cuda_runtime.h>

#include <cstdint>

#include "make_inplace/kernels/scalar_kind.h"
#include "make_inplace/kernels/square_matmul_geometry.h"

namespace make_inplace::kernels {

// How many CTAs of the kernel (element type, weight layout) fit at once on the
// current device; 0 when it is not built (square_matmul_wgmma_built()). Sets
// the kernel's attributes on that device, which a launch needs: call it before
// the first launch per device.
int square_matmul_wgmma_rows_residency(ScalarKind kind, bool transpose);

// x, w, bias (may be null) are row-major and contiguous; w is n x n; kind is
// float16 or bfloat16, n a multiple of 8 from wgmma_rows::kMinN to kMaxN, x and w
// 16-byte aligned, on an sm_90 device. The bias is added in fp32 before
// rounding. `ctas`: the grid, at most the residency (each CTA loops over the
// row-blocks). Launches one kernel and returns its launch error
// (cudaErrorNotSupported or cudaErrorInvalidValue for a case outside the
// above, before anything is written).
cudaError_t square_matmul_wgmma_rows(ScalarKind kind, void* x, const void* w, const void* bias, int64_t rows,
                                     int64_t n, bool transpose, int ctas, cudaStream_t stream);

}  // namespace make_inplace::kernels
