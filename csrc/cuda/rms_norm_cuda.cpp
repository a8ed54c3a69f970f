// rms_norm_ / rms_norm_stats_ / rms_norm_backward on CUDA: checks, then the
// torch-free kernels on the current stream under a device guard.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "make_inplace/kernels/rms_norm.h"
#include "make_inplace/launch_check.h"
#include "make_inplace/rms_norm.h"
#include "make_inplace/torch_kinds.h"

namespace make_inplace {
namespace {

void rms_norm_cuda(const at::Tensor& x, at::IntArrayRef normalized_shape,
                   const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  double e = 0;
  const LayerNormPlan p = check_rms_norm_args(x, normalized_shape, weight, eps, &e);
  const c10::cuda::CUDAGuard guard(x.device());
  if (x.numel() == 0) return;
  check_launch(kernels::rms_norm_forward_cuda(scalar_kind(x.scalar_type()), x.data_ptr(),
                                              data_or_null(weight), p.rows, p.n, e, nullptr,
                                              at::cuda::getCurrentCUDAStream().stream()),
               "rms_norm_");
}

at::Tensor rms_norm_stats_cuda(const at::Tensor& x, at::IntArrayRef normalized_shape,
                               const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  double e = 0;
  const LayerNormPlan p = check_rms_norm_args(x, normalized_shape, weight, eps, &e, "rms_norm_stats_");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor rstd = at::empty(p.batch_shape, x.options().dtype(layer_norm_stat_dtype(x.scalar_type())));
  if (x.numel() == 0) return rstd;
  check_launch(kernels::rms_norm_forward_cuda(scalar_kind(x.scalar_type()), x.data_ptr(),
                                              data_or_null(weight), p.rows, p.n, e, rstd.data_ptr(),
                                              at::cuda::getCurrentCUDAStream().stream()),
               "rms_norm_stats_");
  return rstd;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cuda(
    const at::Tensor& grad_output, const at::Tensor& output, at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, const at::Tensor& rstd, std::array<bool, 2> output_mask) {
  const LayerNormPlan p = check_rms_norm_backward_args(grad_output, output, normalized_shape, weight, rstd);
  const c10::cuda::CUDAGuard guard(output.device());
  LayerNormGrads g = allocate_layer_norm_grads(output, weight, std::nullopt, {output_mask[0], output_mask[1], false});
  if (p.rows == 0 || p.n == 0) {
    if (g.grad_weight.defined()) g.grad_weight.zero_();  // a sum over no rows
    return {g.grad_input, g.grad_weight};
  }
  const auto kind = scalar_kind(output.scalar_type());
  const int64_t workspace_bytes = kernels::rms_norm_backward_cuda_workspace(kind, p.rows, p.n, g.grad_weight.defined());
  at::Tensor workspace;
  if (workspace_bytes > 0) workspace = at::empty({workspace_bytes}, output.options().dtype(at::kByte));
  check_launch(kernels::rms_norm_backward_cuda(
                   kind, grad_output.const_data_ptr(), output.const_data_ptr(), data_or_null(weight),
                   rstd.const_data_ptr(), p.rows, p.n, data_or_null(g.grad_input),
                   data_or_null(g.grad_weight), workspace.defined() ? workspace.data_ptr() : nullptr,
                   at::cuda::getCurrentCUDAStream().stream()),
               "rms_norm_backward");
  return {g.grad_input, g.grad_weight};
}

}  // namespace

TORCH_LIBRARY_IMPL(make_inplace, CUDA, m) {
  m.impl("rms_norm_", &rms_norm_cuda);
  m.impl("rms_norm_stats_", &rms_norm_stats_cuda);
  m.impl("rms_norm_backward", &rms_norm_backward_cuda);
}

}  // namespace make_inplace
