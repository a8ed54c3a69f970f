#pragma once
// Trilinear interpolation of per-point corner features, forward and backward.
// Torch-free: raw pointers, int64 sizes and element strides, a stream.
//
//   feats  (n, 8, f)  any strides      points (n, 3)  any strides
//   out    (n, f)     contiguous       out[p, c] = sum_k w_k(points[p]) feats[p, k, c]
//
// With (u, v, w) = (points + 1) / 2, corner k = 4i + 2j + l has weight
// (i ? u : 1-u)(j ? v : 1-v)(l ? w : 1-w). Points outside [-1, 1] use the same
// polynomial (extrapolation, no clamping).
//
// Backward, given grad_out (n, f) with any strides:
//   grad_feats  (n, 8, f) contiguous: w_k * grad_out            (always)
//   grad_points (n, 3)    contiguous: sum_c grad_out * d out / d points
//                                    (only when feats and grad_points are given)
// With accumulate, results are added to the buffers instead of written.
#include <cstdint>

#include "make_inplace/kernels/scalar_kind.h"

#if defined(__CUDACC__) || defined(MAKE_INPLACE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace make_inplace::kernels {

// A read-only strided operand: element strides per dimension.
struct TrilinearInput {
  const void* data;
  int64_t stride[3];
};

// Returns 0 on success, nonzero for an unsupported kind.
int trilinear_forward_cpu(ScalarKind kind, TrilinearInput feats,
                          TrilinearInput points, void* out, int64_t n,
                          int64_t f);

// feats.data and grad_points may both be null (no points gradient); when
// grad_points is non-null feats.data must be too.
int trilinear_backward_cpu(ScalarKind kind, TrilinearInput grad_out,
                           TrilinearInput points, TrilinearInput feats,
                           void* grad_feats, void* grad_points, int64_t n,
                           int64_t f, bool accumulate);

#if defined(__CUDACC__) || defined(MAKE_INPLACE_WITH_CUDA)
// Launch on `stream`; return the launch's error code.
cudaError_t trilinear_forward_cuda(ScalarKind kind, TrilinearInput feats,
                                   TrilinearInput points, void* out, int64_t n,
                                   int64_t f, cudaStream_t stream);

cudaError_t trilinear_backward_cuda(ScalarKind kind, TrilinearInput grad_out,
                                    TrilinearInput points, TrilinearInput feats,
                                    void* grad_feats, void* grad_points,
                                    int64_t n, int64_t f, bool accumulate,
                                    cudaStream_t stream);
#endif

}  // namespace make_inplace::kernels
