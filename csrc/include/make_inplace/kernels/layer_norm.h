#pragma once
// layer_norm_ and its backward as torch-free kernels over `rows` rows of `n`
// contiguous elements (n = the product of normalized_shape).
//
// Statistics (mean, rstd) are in the accumulation type: float for float16,
// bfloat16 and float32 inputs, double for float64 (as torch's native_layer_norm).
#include <cstdint>

#include "make_inplace/kernels/scalar_kind.h"

#if defined(MAKE_INPLACE_WITH_CUDA) || defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

namespace make_inplace::kernels {

// The backward rebuilds x_hat = (y - bias) / weight from the output. Where
// |weight| < kLayerNormWeightClamp the division uses +-kLayerNormWeightClamp
// instead (the sign of weight, + for 0), as apex's memory-efficient layer norm
// does, so the rebuilt x_hat stays finite. For such features x_hat, and hence
// grad_weight and grad_input at that feature, are approximate (exact x_hat
// would need x, which was overwritten); a weight of exactly 0 loses that
// feature's x_hat, giving grad_weight 0 there. Other features stay exact: a
// feature's share of the row sums is dy * w * x_hat, which the clamp leaves
// at about the true value (|w| tiny).
constexpr double kLayerNormWeightClamp = 1e-5;

// x <- (x - mean) * rstd * weight + bias per row, rstd = 1/sqrt(var + eps)
// with the biased variance. weight, bias, mean and rstd may each be null;
// mean/rstd (rows elements of the accumulation type) are written when given.
int layer_norm_forward_cpu(ScalarKind kind, void* x, const void* weight,
                           const void* bias, int64_t rows, int64_t n,
                           double eps, void* mean, void* rstd);

// From grad_output, the output y, weight/bias (null when absent) and the
// forward's rstd: grad_input (rows x n), grad_weight and grad_bias (n each),
// each written only when its pointer is non-null. None may overlap the inputs.
int layer_norm_backward_cpu(ScalarKind kind, const void* grad_output,
                            const void* y, const void* weight,
                            const void* bias, const void* rstd, int64_t rows,
                            int64_t n, void* grad_input, void* grad_weight,
                            void* grad_bias);

#if defined(MAKE_INPLACE_WITH_CUDA) || defined(__CUDACC__)
// The forward on the GPU, launched on `stream`; uses no device memory beyond
// its arguments.
cudaError_t layer_norm_forward_cuda(ScalarKind kind, void* x,
                                    const void* weight, const void* bias,
                                    int64_t rows, int64_t n, double eps,
                                    void* mean, void* rstd,
                                    cudaStream_t stream);

// Bytes of device workspace layer_norm_backward_cuda needs for the column
// sums of grad_weight / grad_bias (0 when neither is requested).
int64_t layer_norm_backward_cuda_workspace(ScalarKind kind, int64_t rows,
                                           int64_t n, bool weight_or_bias);

cudaError_t layer_norm_backward_cuda(ScalarKind kind, const void* grad_output,
                                     const void* y, const void* weight,
                                     const void* bias, const void* rstd,
                                     int64_t rows, int64_t n,
                                     void* grad_input, void* grad_weight,
                                     void* grad_bias, void* workspace,
                                     cudaStream_t stream);
#endif

}  // namespace make_inplace::kernels
