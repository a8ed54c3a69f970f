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
// current device: a row-block of results (16 rows at the least) must fit in
// the shared memory of all co-resident CTAs of one cooperative launch. On an
// H100 that is n up to about 640 000 (fp16/bf16), 420 000 (fp32) and
// 200 000 (fp64), beyond any weight that fits in its memory. False when the
// device cannot launch cooperatively. The first call per device sets the
// kernels' shared-memory attributes.
bool square_matmul_fused_supports(ScalarKind kind, int64_t n);

// x, w, bias (may be null) are row-major and contiguous; w is n x n; any
// rows >= 0 and n >= 1 that square_matmul_fused_supports accepts (otherwise
// cudaErrorInvalidValue, before anything is written). Half types accumulate
// in fp32; the bias is added in fp32 (fp64 for doubles) before rounding.
// fp32 is always exact FFMA: allow_tf32 permits TF32 but does not require
// it. Launches one cooperative kernel on `stream` and returns its launch
// error; uses no device memory beyond x, w and bias.
cudaError_t square_matmul_fused(ScalarKind kind, void* x, const void* w,
                                const void* bias, int64_t rows, int64_t n,
                                bool transpose, bool allow_tf32,
                                cudaStream_t stream);

}  // namespace make_inplace::kernels
