#pragma once
// softmax_ and its backward as torch-free kernels: raw pointers, int64 sizes
// and, for CUDA, a stream. The tensor is viewed as (outer, n, inner) with the
// softmax taken over n: inner == 1 is the last-dim case (rows), inner > 1 a
// "column" softmax over a middle dim, done in place through the stride.
#include <cstdint>

#include "make_inplace/kernels/scalar_kind.h"

#if defined(__CUDACC__)
#define MAKE_INPLACE_HD __host__ __device__
#else
#define MAKE_INPLACE_HD
#endif

#if defined(MAKE_INPLACE_WITH_CUDA) || defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

namespace make_inplace::kernels {

// Dims of the outer or inner index after merging mergeable dims; an x of rank
// k splits into at most k - 1 of them, so this bound only matters for ranks
// above 7 with a mask broadcast in alternating dims (the binding rejects those
// with an error, never silently).
constexpr int kMaskMaxDims = 6;

// An additive mask of x's dtype read through broadcast strides (0 along a
// broadcast dim), in elements, so it is never materialized at x's size.
// element (o, d, i) of x adds mask[outer_offset(o) + d * dim_stride +
// inner_offset(i)], where o and i are decomposed over the listed sizes
// (row-major, last size fastest).
struct MaskLayout {
  const void* data = nullptr;  // null: no mask
  int outer_rank = 0;
  int64_t outer_sizes[kMaskMaxDims] = {};
  int64_t outer_strides[kMaskMaxDims] = {};
  int64_t dim_stride = 0;
  int inner_rank = 0;
  int64_t inner_sizes[kMaskMaxDims] = {};
  int64_t inner_strides[kMaskMaxDims] = {};
};

// The loop runs over the fixed kMaskMaxDims with constant indices, so on the
// GPU the layout stays in kernel-parameter space instead of being copied to
// local memory for dynamic indexing.
MAKE_INPLACE_HD inline int64_t mask_offset(int rank, const int64_t (&sizes)[kMaskMaxDims],
                                           const int64_t (&strides)[kMaskMaxDims],
                                           int64_t index) {
  int64_t offset = 0;
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int k = kMaskMaxDims - 1; k >= 0; --k) {
    if (k < rank) {
      offset += (index % sizes[k]) * strides[k];
      index /= sizes[k];
    }
  }
  return offset;
}

// x <- softmax(x * scale + mask, over n). causal_rows > 0 (inner == 1 only)
// masks element j of row r out when j > r % causal_rows: top-left causal
// alignment with causal_rows the query length x.size(-2). Masked elements
// become 0; a row whose values are all -inf becomes NaN, as in torch.
// Returns 0 (the CPU kernels cannot fail once the binding checked the args).
int softmax_forward_cpu(ScalarKind kind, void* x, int64_t outer, int64_t n,
                        int64_t inner, double scale, int64_t causal_rows,
                        const MaskLayout& mask);

// grad_input = scale * y * (grad_output - sum_n(grad_output * y)).
// grad_input may be grad_output itself (each element is read before it is
// written, by the same thread); it must not overlap y.
int softmax_backward_cpu(ScalarKind kind, const void* grad_output,
                         const void* y, void* grad_input, int64_t outer,
                         int64_t n, int64_t inner, double scale);

#if defined(MAKE_INPLACE_WITH_CUDA) || defined(__CUDACC__)
// The same on the GPU, launched on `stream`; returns the launch's error. Uses
// no device memory beyond its arguments.
cudaError_t softmax_forward_cuda(ScalarKind kind, void* x, int64_t outer,
                                 int64_t n, int64_t inner, double scale,
                                 int64_t causal_rows, const MaskLayout& mask,
                                 cudaStream_t stream);

cudaError_t softmax_backward_cuda(ScalarKind kind, const void* grad_output,
                                  const void* y, void* grad_input,
                                  int64_t outer, int64_t n, int64_t inner,
                                  double scale, cudaStream_t stream);
#endif

}  // namespace make_inplace::kernels
