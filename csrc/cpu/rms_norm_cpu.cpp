// rms_norm_ / rms_norm_stats_ / rms_norm_backward on the CPU: checks, then the
// torch-free kernels.
#include <torch/library.h>

#include "make_inplace/kernels/rms_norm.h"
#include "make_inplace/rms_norm.h"
#include "make_inplace/torch_kinds.h"

namespace make_inplace {
namespace {

void rms_norm_cpu(const at::Tensor& x, at::IntArrayRef normalized_shape,
                  const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  double e = 0;
  const LayerNormPlan p = check_rms_norm_args(x, normalized_shape, weight, eps, &e);
  if (x.numel() == 0) return;
  kernels::rms_norm_forward_cpu(scalar_kind(x.scalar_type()), x.data_ptr(), data_or_null(weight),
                                p.rows, p.n, e, nullptr);
}

at::Tensor rms_norm_stats_cpu(const at::Tensor& x, at::IntArrayRef normalized_shape,
                              const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  double e = 0;
  const LayerNormPlan p = check_rms_norm_args(x, normalized_shape, weight, eps, &e, "rms_norm_stats_");
  at::Tensor rstd = at::empty(p.batch_shape, x.options().dtype(layer_norm_stat_dtype(x.scalar_type())));
  if (x.numel() == 0) return rstd;
  kernels::rms_norm_forward_cpu(scalar_kind(x.scalar_type()), x.data_ptr(), data_or_null(weight),
                                p.rows, p.n, e, rstd.data_ptr());
  return rstd;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cpu(
    const at::Tensor& grad_output, const at::Tensor& output, at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, const at::Tensor& rstd, std::array<bool, 2> output_mask) {
  const LayerNormPlan p = check_rms_norm_backward_args(grad_output, output, normalized_shape, weight, rstd);
  LayerNormGrads g = allocate_layer_norm_grads(output, weight, std::nullopt, {output_mask[0], output_mask[1], false});
  if (p.rows == 0 || p.n == 0) {
    if (g.grad_weight.defined()) g.grad_weight.zero_();  // a sum over no rows
    return {g.grad_input, g.grad_weight};
  }
  kernels::rms_norm_backward_cpu(scalar_kind(output.scalar_type()), grad_output.const_data_ptr(),
                                 output.const_data_ptr(), data_or_null(weight), rstd.const_data_ptr(),
                                 p.rows, p.n, data_or_null(g.grad_input), data_or_null(g.grad_weight));
  return {g.grad_input, g.grad_weight};
}

}  // namespace

TORCH_LIBRARY_IMPL(make_inplace, CPU, m) {
  m.impl("rms_norm_", &rms_norm_cpu);
  m.impl("rms_norm_stats_", &rms_norm_stats_cpu);
  m.impl("rms_norm_backward", &rms_norm_backward_cpu);
}

}  // namespace make_inplace
