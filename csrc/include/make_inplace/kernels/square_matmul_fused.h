#pragma once
// The zero-workspace square matmul kernel: x[rows, n] <- x @ w (+ bias), or
// x @ w^T with transpose, using no device memory beyond x, w and bias. Every
// element of a row is read by all products of that row before any of them is
// written back, so results are held on chip until the rows they replace have
// been fully consumed. Torch-free: raw pointers, sizes and a stream.
#include <cuda_runtime.h>

#include <cstdint>

#include "make_inplace/kernels/scalar_kind.h"

namespace make_inplace::kernels {

// Whether square_matmul_fused handles width n for this element type on the
// current device (the kernel needs a row-block of results to fit on chip).
bool square_matmul_fused_supports(ScalarKind kind, int64_t n);

// x, w, bias (may be null) are row-major and contiguous; w is n x n. fp32
// uses TF32 tensor cores only when allow_tf32 is true. Launches on `stream`
// and returns the launch's error code.
cudaError_t square_matmul_fused(ScalarKind kind, void* x, const void* w,
                                const void* bias, int64_t rows, int64_t n,
                                bool transpose, bool allow_tf32,
                                cudaStream_t stream);

}  // namespace make_inplace::kernels
