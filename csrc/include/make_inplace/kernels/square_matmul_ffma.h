#pragma once
// The float32 in-place square matmul on CUDA cores (FFMA, IEEE fp32, no
// TF32): x[rows, n] <- x @ w (+ bias), or x @ w^T with transpose. Groups of
// CTAs own 128-row blocks of x, each CTA one 128 x 128 result tile held in
// registers; a CTA writes its tile over x once every CTA of its group has
// finished reading the block, which one 4-byte counter per row-block tells
// (counted mode) or a cluster barrier (clusters, no memory at all).
// Torch-free: raw pointers, sizes and a stream.
#include <cuda_runtime.h>

#include <cstdint>

namespace make_inplace::kernels {

// Whether square_matmul_ffma runs this case (weight layout `transpose`, mode
// `counted`) on the current device: n is a
// multiple of 4 (16-byte loads and stores), x, w and bias are 16-byte
// aligned, rows < 2^31, and a row-block's ceil(n / 128) CTAs fit at once:
// counted, in one cooperative grid (n up to about 33 000 on an H100);
// otherwise in one thread-block cluster (sm_90, at most 16 CTAs: n <= 2048).
bool square_matmul_ffma_supports(int64_t rows, int64_t n, const void* x, const void* w, const void* bias,
                                 bool transpose, bool counted);

// Bytes of device memory for square_matmul_ffma's counted mode: one counter
// per 128-row block.
int64_t square_matmul_ffma_counter_bytes(int64_t rows);

// x, w, bias (may be null) are row-major and contiguous float32; w is n x n.
// counters: square_matmul_ffma_counter_bytes(rows) bytes of device memory,
// zeroed here on `stream` (a cooperative grid whose groups of CTAs meet on
// them), or null (clusters, no memory at all). Launches one kernel and
// returns its launch error (cudaErrorNotSupported for a case that
// square_matmul_ffma_supports rejects, before anything is written).
cudaError_t square_matmul_ffma(float* x, const float* w, const float* bias, int64_t rows, int64_t n,
                               bool transpose, uint32_t* counters, cudaStream_t stream);

}  // namespace make_inplace::kernels
