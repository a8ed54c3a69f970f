#pragma once
// Batched outer product, forward and backward. Torch-free: raw pointers,
// int64 sizes and element strides, a stream.
//
//   a (batch, n), b (batch, m)   any strides
//   out (batch, n, m)            contiguous: out[s, i, j] = a[s, i] * b[s, j]
//
// Backward, given grad_out (batch, n, m) with any strides:
//   grad_a (batch, n) contiguous: grad_a[s, i] = sum_j grad_out[s, i, j] b[s, j]
//   grad_b (batch, m) contiguous: grad_b[s, j] = sum_i grad_out[s, i, j] a[s, i]
// Either buffer may be null (not computed). With accumulate, results are
// added to the buffers instead of written.
#include <cstdint>

#include "make_inplace/kernels/scalar_kind.h"

#if defined(__CUDACC__) || defined(MAKE_INPLACE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace make_inplace::kernels {

// A read-only strided operand: element strides per dimension.
struct OuterInput {
  const void* data;
  int64_t stride[3];
};

// Return 0 on success, nonzero for an unsupported kind.
int outer_product_forward_cpu(ScalarKind kind, OuterInput a, OuterInput b,
                              void* out, int64_t batch, int64_t n, int64_t m);

int outer_product_backward_cpu(ScalarKind kind, OuterInput grad_out,
                               OuterInput a, OuterInput b, void* grad_a,
                               void* grad_b, int64_t batch, int64_t n,
                               int64_t m, bool accumulate);

#if defined(__CUDACC__) || defined(MAKE_INPLACE_WITH_CUDA)
// Launch on `stream`; return the launch's error code.
cudaError_t outer_product_forward_cuda(ScalarKind kind, OuterInput a,
                                       OuterInput b, void* out, int64_t batch,
                                       int64_t n, int64_t m,
                                       cudaStream_t stream);

cudaError_t outer_product_backward_cuda(ScalarKind kind, OuterInput grad_out,
                                        OuterInput a, OuterInput b,
                                        void* grad_a, void* grad_b,
                                        int64_t batch, int64_t n, int64_t m,
                                        bool accumulate, cudaStream_t stream);
#endif

}  // namespace make_inplace::kernels
