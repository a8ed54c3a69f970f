#pragma once
// The CPU row-at-a-time square matmul: x[rows, n] <- x @ w (+ bias), or
// x @ w^T with transpose, holding one row's results in an n-element buffer
// until every product that reads the row is done. Torch-free (raw pointers and
// sizes) so the PyTorch op and the MindSpore C ABI run the same code.
#include <cstdint>

#include "make_inplace/kernels/scalar_kind.h"

namespace make_inplace::kernels {

// x (rows x n), w (n x n) and bias (n, or null) are row-major and contiguous,
// all of element type `kind`; half types accumulate in float32. Rows are split
// over threads through the registered parallel-for (cpu_parallel.h: ATen's
// pool in the PyTorch extension, OpenMP in the MindSpore bridge). Returns 0,
// or -1 for an unknown `kind`. Each thread keeps a panel of rows and a packed
// slice of w on its stack (about 100 KiB) and allocates nothing, except for
// rows wider than 16384 elements (8192 for float64): one heap row buffer per
// thread.
int square_matmul_rowwise(ScalarKind kind, void* x, const void* w,
                          const void* bias, int64_t rows, int64_t n,
                          bool transpose);

// Whether square_matmul_rowwise multiplies bfloat16 (rows of even width) with
// hardware dot products on this CPU: AVX-512 in use (ATEN_CPU_CAPABILITY not
// below avx512) with AVX512-BF16.
bool square_matmul_rows_bf16_dot();

}  // namespace make_inplace::kernels
