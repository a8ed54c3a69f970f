#pragma once
// layer_norm_ / layer_norm_stats_ / layer_norm_backward: argument checks
// shared by the CPU and CUDA bindings. Every check runs before any write.
#include <ATen/ATen.h>

#include <array>
#include <optional>
#include <vector>

#include "make_inplace/checks.h"

namespace make_inplace {

struct LayerNormPlan {
  int64_t rows = 0, n = 1;
  std::vector<int64_t> batch_shape;  // x.shape[:-len(normalized_shape)]
};

inline at::ScalarType layer_norm_stat_dtype(at::ScalarType t) {
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

inline LayerNormPlan check_layer_norm_shape(const char* op, const at::Tensor& x, const char* x_name,
                                            at::IntArrayRef normalized_shape) {
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  MAKE_INPLACE_CHECK(op, k >= 1, "normalized_shape must have at least one dim, got ",
              normalized_shape);
  MAKE_INPLACE_CHECK(op, x.dim() >= k && x.sizes().slice(x.dim() - k).equals(normalized_shape),
              "normalized_shape ", normalized_shape, " must equal the last ", k,
              " dim(s) of ", x_name, ", got ", x_name, " of shape ", x.sizes());
  LayerNormPlan plan;
  plan.n = 1;
  for (int64_t s : normalized_shape) plan.n *= s;
  plan.batch_shape = x.sizes().slice(0, x.dim() - k).vec();
  plan.rows = 1;
  for (int64_t s : plan.batch_shape) plan.rows *= s;
  return plan;
}

inline void check_affine(const char* op, const std::optional<at::Tensor>& t, const char* name,
                         const at::Tensor& x, const char* x_name,
                         at::IntArrayRef normalized_shape, bool x_written) {
  if (!t.has_value() || !t->defined()) return;
  MAKE_INPLACE_CHECK(op, t->sizes().equals(normalized_shape), name,
              " must have shape normalized_shape = ", normalized_shape, ", got ",
              t->sizes());
  check_same_dtype(op, *t, name, x, x_name);
  check_same_device(op, *t, name, x, x_name);
  check_contiguous(op, *t, name, "it is read in place, never copied");
  if (x_written) check_no_overlap(op, x, x_name, *t, name);
}

inline LayerNormPlan check_layer_norm_args(const at::Tensor& x,
                                           at::IntArrayRef normalized_shape,
                                           const std::optional<at::Tensor>& weight,
                                           const std::optional<at::Tensor>& bias,
                                           double eps, const char* op = "layer_norm_") {
  check_float_dtype(op, x, "x");
  LayerNormPlan plan = check_layer_norm_shape(op, x, "x", normalized_shape);
  check_contiguous(op, x, "x",
                   "the result is written into x's own memory, so a copy "
                   "would not reach the caller");
  check_affine(op, weight, "weight", x, "x", normalized_shape, true);
  check_affine(op, bias, "bias", x, "x", normalized_shape, true);
  MAKE_INPLACE_CHECK(op, eps >= 0, "eps must be >= 0 (and not NaN), got ", eps);
  return plan;
}

inline LayerNormPlan check_layer_norm_backward_args(
    const at::Tensor& grad_output, const at::Tensor& output,
    at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const at::Tensor& rstd,
    const char* op = "layer_norm_backward") {
  check_float_dtype(op, output, "output");
  check_same_dtype(op, grad_output, "grad_output", output, "output");
  check_same_device(op, grad_output, "grad_output", output, "output");
  MAKE_INPLACE_CHECK(op, grad_output.sizes() == output.sizes(),
              "grad_output must have output's shape ", output.sizes(), ", got ",
              grad_output.sizes());
  LayerNormPlan plan = check_layer_norm_shape(op, output, "output", normalized_shape);
  check_contiguous(op, grad_output, "grad_output", "the kernel reads it row by row");
  check_contiguous(op, output, "output", "the kernel reads it row by row");
  check_affine(op, weight, "weight", output, "output", normalized_shape, false);
  check_affine(op, bias, "bias", output, "output", normalized_shape, false);
  const at::ScalarType stat = layer_norm_stat_dtype(output.scalar_type());
  MAKE_INPLACE_CHECK(op, rstd.scalar_type() == stat, "rstd must have dtype ", stat,
              " (the forward's statistics), got ", rstd.scalar_type());
  check_same_device(op, rstd, "rstd", output, "output");
  MAKE_INPLACE_CHECK(op, rstd.numel() == plan.rows && rstd.is_contiguous(),
              "rstd must be contiguous with one value per row (", plan.rows,
              "), got shape ", rstd.sizes(), " and strides ", rstd.strides());
  return plan;
}

// The backward's result buffers: undefined where output_mask says not needed
// or the affine parameter is absent.
struct LayerNormGrads {
  at::Tensor grad_input, grad_weight, grad_bias;
};

inline LayerNormGrads allocate_layer_norm_grads(
    const at::Tensor& output, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, std::array<bool, 3> output_mask) {
  LayerNormGrads g;
  if (output_mask[0]) g.grad_input = at::empty_like(output);
  if (output_mask[1] && weight.has_value() && weight->defined())
    g.grad_weight = at::empty_like(*weight);
  if (output_mask[2] && bias.has_value() && bias->defined())
    g.grad_bias = at::empty_like(*bias);
  return g;
}

inline void* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr() : nullptr;
}

inline const void* data_or_null(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->const_data_ptr() : nullptr;
}

}  // namespace make_inplace
