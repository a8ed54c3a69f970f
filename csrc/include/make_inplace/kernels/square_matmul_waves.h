#pragma once
// The zero-workspace square matmul kernel for every GPU (sm_80+) and dtype:
// x[rows, n] <- x @ w (+ bias), or x @ w^T with transpose, using no device
// memory beyond x, w and bias. A persistent cooperative grid works through
// the rows in waves of row-blocks: results are parked on chip until a grid
// barrier says every read of the wave's rows is done, then written back.
// Torch-free: raw pointers, sizes and a stream.
#include <cuda_runtime.h>

#include <cstdint>

#include "make_inplace/kernels/scalar_kind.h"

namespace make_inplace::kernels {

// The widest n square_matmul_waves takes for this element type on the current
// device (0: it cannot launch cooperatively): a row-block of results (16 rows
// at the least) must fit in the shared memory of all co-resident CTAs
// (docs/square_matmul.md has an H100's figures). The first call per device
// sets the kernels' shared-memory attributes.
int64_t square_matmul_waves_max_width(ScalarKind kind);

// x, w, bias (may be null) are row-major and contiguous; w is n x n; any
// rows >= 0 and 1 <= n <= square_matmul_waves_max_width(kind) (otherwise
// cudaErrorInvalidValue, before anything is written). Half types accumulate
// in fp32 (tensor cores); fp32 and fp64 use exact FFMA/DFMA, never TF32. The
// bias is added in fp32 (fp64 for doubles) before rounding. Launches one
// cooperative kernel on `stream` and returns its launch error.
cudaError_t square_matmul_waves(ScalarKind kind, void* x, const void* w, const void* bias, int64_t rows,
                                int64_t n, bool transpose, cudaStream_t stream);

}  // namespace make_inplace::kernels
