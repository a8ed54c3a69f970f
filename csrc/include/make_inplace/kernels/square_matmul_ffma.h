#pragma once
// The float32 in-place square matmul on CUDA cores (FFMA, IEEE fp32, no
// TF32): x[rows, n] <- x @ w (+ bias), or x @ w^T with transpose. Groups of
// ceil(n / (128 t)) CTAs own 128-row blocks of x, each CTA t = 1 or 2 of its
// 128 x 128 result tiles (the last in registers, the first parked in shared
// memory); a CTA writes its tiles over x once every CTA of its group has
// finished reading the block, which one 4-byte counter per row-block tells
// (counted mode) or the cooperative grid's own barrier once per round of
// row-blocks (no memory at all).
// Torch-free: raw pointers, sizes and a stream.
#include <cuda_runtime.h>

#include <cstdint>

#include "make_inplace/kernels/square_matmul_geometry.h"

namespace make_inplace::kernels {

// How many CTAs of the kernel (weight layout `transpose`, tiles_per_cta 1 or
// 2) fit at once in a cooperative grid on the current device (0 without
// cooperative launch). Sets the kernel's shared-memory attribute on that
// device, which its launches need: call it before the first launch per device.
int square_matmul_ffma_resident_ctas(bool transpose, int tiles_per_cta);

// x, w, bias (may be null) are row-major, contiguous and 16-byte aligned
// float32; w is n x n, n a multiple of 4; rows up to kMaxGroupRows. `launch`
// as the routing policy planned it: groups of ceil(n / (128 t)) CTAs, t =
// tiles_per_cta (1 or 2), in one cooperative grid. counters:
// row_block_counter_bytes(rows) bytes of device memory, zeroed here on
// `stream`, or null (the groups meet at the grid's barrier once a round);
// launch.meet says which.
// Launches one kernel and returns its launch error
// (cudaErrorNotSupported or cudaErrorInvalidValue for a case outside the
// above, before anything is written).
cudaError_t square_matmul_ffma(float* x, const float* w, const float* bias, int64_t rows, int64_t n, bool transpose,
                               const RowBlockLaunch& launch, uint32_t* counters, cudaStream_t stream);

}  // namespace make_inplace::kernels
