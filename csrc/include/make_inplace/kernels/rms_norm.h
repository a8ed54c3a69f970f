#pragma once
// rms_norm_ and its backward as torch-free kernels over `rows` rows of `n`
// contiguous elements (n = the product of normalized_shape).
//
// x <- x * rstd * weight per row, rstd = 1 / sqrt(mean(x^2) + eps): the
// semantics of torch.nn.functional.rms_norm. The per-row rstd is in the
// accumulation type: float for float16, bfloat16 and float32 inputs, double
// for float64.
#include <cstdint>

#include "make_inplace/kernels/scalar_kind.h"

#if defined(MAKE_INPLACE_WITH_CUDA) || defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

namespace make_inplace::kernels {

// The backward rebuilds x_hat = x * rstd = y / weight from the output. Where
// |weight| < kRmsNormWeightClamp it divides by +-kRmsNormWeightClamp instead
// (the sign of weight, + for 0), as layer_norm_'s backward does, so x_hat stays
// finite; those features' grad_weight and grad_input are approximate.
constexpr double kRmsNormWeightClamp = 1e-5;

// weight and rstd may be null; rstd (rows elements) is written when given.
int rms_norm_forward_cpu(ScalarKind kind, void* x, const void* weight, int64_t rows, int64_t n,
                         double eps, void* rstd);

// From grad_output, the output y, weight (null when absent) and the forward's
// rstd: grad_input (rows x n) and grad_weight (n), each written only when its
// pointer is non-null. None may overlap the inputs.
int rms_norm_backward_cpu(ScalarKind kind, const void* grad_output, const void* y,
                          const void* weight, const void* rstd, int64_t rows, int64_t n,
                          void* grad_input, void* grad_weight);

#if defined(MAKE_INPLACE_WITH_CUDA) || defined(__CUDACC__)
// The forward on the GPU, launched on `stream`; no device memory beyond its arguments.
cudaError_t rms_norm_forward_cuda(ScalarKind kind, void* x, const void* weight, int64_t rows,
                                  int64_t n, double eps, void* rstd, cudaStream_t stream);

// Bytes of device workspace rms_norm_backward_cuda needs for grad_weight's
// column sums (0 when grad_weight is not requested).
int64_t rms_norm_backward_cuda_workspace(ScalarKind kind, int64_t rows, int64_t n, bool weight);

cudaError_t rms_norm_backward_cuda(ScalarKind kind, const void* grad_output, const void* y,
                                   const void* weight, const void* rstd, int64_t rows, int64_t n,
                                   void* grad_input, void* grad_weight, void* workspace,
                                   cudaStream_t stream);
#endif

}  // namespace make_inplace::kernels
