#pragma once
// The Hopper (sm_90a) in-place square matmul for 16-bit types:
// x[rows, n] <- x @ w (+ bias), or x @ w^T with transpose, with wgmma tensor
// cores fed by TMA. Groups of CTAs own 128-row blocks of x; each CTA computes
// 128 x 256 (or 128 x 192) result tiles of its group's block, and the block
// is written back only once every CTA of the group has finished reading it.
// A group is a thread-block cluster, or consecutive CTAs of a cooperative
// grid (every SM busy, where clusters, which must fit in one GPC, leave some
// idle) that meet on one counter per row-block or, with no memory at all, at
// the grid's barrier once a round.
// Torch-free: raw pointers, sizes and a stream.
#include <cuda_runtime.h>

#include <cstdint>

#include "make_inplace/kernels/scalar_kind.h"
#include "make_inplace/kernels/square_matmul_geometry.h"

namespace make_inplace::kernels {

// Whether this library carries the sm_90a kernels (built with
// MAKE_INPLACE_SM90A); without them the kernel never launches.
bool square_matmul_wgmma_built();

// Whether the driver can encode TMA tensor maps.
bool square_matmul_wgmma_tensor_maps();

// How many CTAs, and clusters of each size, of the variant (element type,
// weight layout, one or two tiles per CTA, tiles of 256 or 192 columns) fit
// at once on the current device; zeros when the variant is not built. Sets
// the variant's kernel attributes on that device, which a launch needs: call
// it before the first launch per device.
Residency square_matmul_wgmma_residency(ScalarKind kind, bool transpose, int tiles_per_cta, int col_tile);

// x, w, bias (may be null) are row-major and contiguous; w is n x n; kind is
// float16 or bfloat16, n a multiple of 8 up to wgmma::kMaxN, x and w 16-byte
// aligned, on an sm_90 device. The bias is added in fp32 before rounding.
// `launch` as the routing policy planned it (groups of group_ctas CTAs, each
// computing tiles_per_cta tiles of col_tile columns, meeting as launch.meet
// says). counters: row_block_counter_bytes(rows) bytes of device memory,
// any contents (the kernel zeroes them), for GroupMeet::kCounters, else null.
// Launches one kernel and returns its launch error (cudaErrorNotSupported or
// cudaErrorInvalidValue for a case outside the above, before anything is
// written).
cudaError_t square_matmul_wgmma(ScalarKind kind, void* x, const void* w, const void* bias, int64_t rows, int64_t n,
                                bool transpose, const RowBlockLaunch& launch, uint32_t* counters,
                                cudaStream_t stream);

}  // namespace make_inplace::kernels
