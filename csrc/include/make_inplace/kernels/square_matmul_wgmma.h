#pragma once
// The Hopper (sm_90a) zero-workspace square matmul for 16-bit types:
// x[rows, n] <- x @ w (+ bias), or x @ w^T with transpose, with wgmma tensor
// cores fed by TMA, and no device memory beyond x, w and bias. A cluster of
// CTAs owns a 128-row block of x at a time: each CTA computes some of the
// block's 128 x 256 result tiles into shared memory, and the block is written
// back only once every CTA of the cluster has finished reading it.
// Torch-free: raw pointers, sizes and a stream.
#include <cuda_runtime.h>

#include <cstdint>

#include "make_inplace/kernels/scalar_kind.h"

namespace make_inplace::kernels {

// Whether square_matmul_wgmma runs this case on the current device: the
// library was built with the sm_90a kernels (MAKE_INPLACE_SM90A) and the
// device is compute capability 9.0; kind is float16 or bfloat16; n is a
// multiple of 8 and at most 8192 (a 128-row block of results must fit in one
// cluster's shared memory); x and w are 16-byte aligned (TMA); rows < 2^31.
// The first call per device and weight layout sets the kernels' attributes.
bool square_matmul_wgmma_supports(ScalarKind kind, int64_t rows, int64_t n, const void* x,
                                  const void* w, bool transpose);

// Bytes of device memory for square_matmul_wgmma's counted mode: one
// counter per 128-row block.
int64_t square_matmul_wgmma_counter_bytes(int64_t rows);

// x, w, bias (may be null) are row-major and contiguous; w is n x n. The bias
// is added in fp32 before rounding. Launches one kernel on `stream` and
// returns its launch error (cudaErrorNotSupported for a case that
// square_matmul_wgmma_supports rejects, before anything is written).
//
// counters null: clusters own the row-blocks (no device memory at all).
// Otherwise square_matmul_wgmma_counter_bytes(rows) bytes of device memory,
// which it zeroes on `stream`: a cooperative grid of plain CTAs in groups
// that own the row-blocks and meet on per-block counters. That fills every
// SM, where clusters, which must fit in one GPC, leave 8-20 of an H100's 132
// idle.
cudaError_t square_matmul_wgmma(ScalarKind kind, void* x, const void* w, const void* bias,
                                int64_t rows, int64_t n, bool transpose, cudaStream_t stream,
                                uint32_t* counters = nullptr);

}  // namespace make_inplace::kernels
