#pragma once
// rms_norm_ / rms_norm_stats_ / rms_norm_backward: argument checks shared by
// the CPU and CUDA bindings. Every check runs before any write.
#include <ATen/ATen.h>

#include <array>
#include <limits>
#include <optional>

#include "make_inplace/layer_norm.h"

namespace make_inplace {

// eps=None means torch.finfo(x.dtype).eps, as torch.nn.functional.rms_norm.
inline double rms_norm_eps(at::ScalarType t, std::optional<double> eps, const char* op = "rms_norm_") {
  if (eps.has_value()) {
    MAKE_INPLACE_CHECK(op, *eps >= 0, "eps must be >= 0 (and not NaN) or None, got ", *eps);
    return *eps;
  }
  switch (t) {
    case at::kHalf: return 0.0009765625;      // 2^-10
    case at::kBFloat16: return 0.0078125;     // 2^-7
    case at::kFloat: return std::numeric_limits<float>::epsilon();
    default: return std::numeric_limits<double>::epsilon();
  }
}

// Shapes as layer_norm_'s (rows x n); returns the plan and the resolved eps.
inline LayerNormPlan check_rms_norm_args(const at::Tensor& x, at::IntArrayRef normalized_shape,
                                         const std::optional<at::Tensor>& weight,
                                         std::optional<double> eps, double* eps_out,
                                         const char* op = "rms_norm_") {
  check_float_dtype(op, x, "x");
  LayerNormPlan plan = check_layer_norm_shape(op, x, "x", normalized_shape);
  check_contiguous(op, x, "x",
                   "the result is written into x's own memory, so a copy "
                   "would not reach the caller");
  check_affine(op, weight, "weight", x, "x", normalized_shape, true);
  *eps_out = rms_norm_eps(x.scalar_type(), eps, op);
  return plan;
}

inline LayerNormPlan check_rms_norm_backward_args(const at::Tensor& grad_output,
                                                  const at::Tensor& output,
                                                  at::IntArrayRef normalized_shape,
                                                  const std::optional<at::Tensor>& weight,
                                                  const at::Tensor& rstd) {
  // The same checks as layer_norm_backward's, without a bias.
  return check_layer_norm_backward_args(grad_output, output, normalized_shape, weight,
                                        std::nullopt, rstd, "rms_norm_backward");
}

}  // namespace make_inplace
