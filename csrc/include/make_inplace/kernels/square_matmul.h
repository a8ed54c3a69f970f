#pragma once
// The CPU row-at-a-time square matmul: x[rows, n] <- x @ w (+ bias), or
// x @ w^T with transpose, holding one row's results in an n-element buffer
// until every product that reads the row is done. Torch-free (raw pointers and
// sizes) so the PyTorch op and the MindSpore C ABI run the same code.
#include <cstdint>

#include "make_inplace/kernels/scalar_kind.h"

namespace make_inplace::kernels {

// x (rows x n), w (n x n) and bias (n, or null) are row-major and contiguous,
// all of element type `kind`; half types accumulate in float32. Rows are
// processed in parallel when the file is compiled with OpenMP (the MindSpore
// bridge); the PyTorch binding instead hands it chunks of rows from
// at::parallel_for. Returns 0, or -1 for an unknown `kind`. Allocates n
// accumulators per thread and nothing else.
int square_matmul_rowwise(ScalarKind kind, void* x, const void* w,
                          const void* bias, int64_t rows, int64_t n,
                          bool transpose);

}  // namespace make_inplace::kernels
