// layer_norm_ / layer_norm_stats_ / layer_norm_backward on CUDA: checks, then
// the torch-free kernels on the current stream under a device guard.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "make_inplace/kernels/layer_norm.h"
#include "make_inplace/launch_check.h"
#include "make_inplace/layer_norm.h"
#include "make_inplace/torch_kinds.h"

namespace make_inplace {
namespace {

void layer_norm_cuda(const at::Tensor& x, at::IntArrayRef normalized_shape,
                     const std::optional<at::Tensor>& weight,
                     const std::optional<at::Tensor>& bias, double eps) {
  const LayerNormPlan p = check_layer_norm_args(x, normalized_shape, weight, bias, eps);
  const c10::cuda::CUDAGuard guard(x.device());
  if (x.numel() == 0) return;
  check_launch(kernels::layer_norm_forward_cuda(
      scalar_kind(x.scalar_type()), x.data_ptr(), data_or_null(weight), data_or_null(bias),
      p.rows, p.n, eps, nullptr, nullptr, at::cuda::getCurrentCUDAStream().stream()), "layer_norm_");
}

std::tuple<at::Tensor, at::Tensor> layer_norm_stats_cuda(
    const at::Tensor& x, at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    double eps) {
  const LayerNormPlan p = check_layer_norm_args(x, normalized_shape, weight, bias, eps, "layer_norm_stats_");
  const c10::cuda::CUDAGuard guard(x.device());
  const auto opts = x.options().dtype(layer_norm_stat_dtype(x.scalar_type()));
  at::Tensor mean = at::empty(p.batch_shape, opts);
  at::Tensor rstd = at::empty(p.batch_shape, opts);
  if (x.numel() == 0) return {mean, rstd};
  check_launch(kernels::layer_norm_forward_cuda(
      scalar_kind(x.scalar_type()), x.data_ptr(), data_or_null(weight), data_or_null(bias),
      p.rows, p.n, eps, mean.data_ptr(), rstd.data_ptr(),
      at::cuda::getCurrentCUDAStream().stream()), "layer_norm_stats_");
  return {mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_cuda(
    const at::Tensor& grad_output, const at::Tensor& output,
    at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const at::Tensor& rstd,
    std::array<bool, 3> output_mask) {
  const LayerNormPlan p = check_layer_norm_backward_args(grad_output, output,
                                                         normalized_shape, weight, bias, rstd);
  const c10::cuda::CUDAGuard guard(output.device());
  LayerNormGrads g = allocate_layer_norm_grads(output, weight, bias, output_mask);
  if (p.rows == 0 || p.n == 0) {
    // No rows: nothing flows; the parameter grads are sums over no rows.
    if (g.grad_weight.defined()) g.grad_weight.zero_();
    if (g.grad_bias.defined()) g.grad_bias.zero_();
    return {g.grad_input, g.grad_weight, g.grad_bias};
  }
  const auto kind = scalar_kind(output.scalar_type());
  const int64_t workspace_bytes = kernels::layer_norm_backward_cuda_workspace(
      kind, p.rows, p.n, g.grad_weight.defined() || g.grad_bias.defined());
  at::Tensor workspace;
  if (workspace_bytes > 0) {
    workspace = at::empty({workspace_bytes}, output.options().dtype(at::kByte));
  }
  check_launch(kernels::layer_norm_backward_cuda(
      kind, grad_output.const_data_ptr(), output.const_data_ptr(), data_or_null(weight),
      data_or_null(bias), rstd.const_data_ptr(), p.rows, p.n, data_or_null(g.grad_input),
      data_or_null(g.grad_weight), data_or_null(g.grad_bias),
      workspace.defined() ? workspace.data_ptr() : nullptr,
      at::cuda::getCurrentCUDAStream().stream()), "layer_norm_backward");
  return {g.grad_input, g.grad_weight, g.grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(make_inplace, CUDA, m) {
  m.impl("layer_norm_", &layer_norm_cuda);
  m.impl("layer_norm_stats_", &layer_norm_stats_cuda);
  m.impl("layer_norm_backward", &layer_norm_backward_cuda);
}

}  // namespace make_inplace
