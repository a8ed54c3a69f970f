// softmax_ / softmax_backward on CUDA: checks, then the torch-free kernels on
// the current stream under a device guard.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "make_inplace/launch_check.h"
#include "make_inplace/softmax.h"
#include "make_inplace/torch_kinds.h"

namespace make_inplace {
namespace {

void softmax_cuda(const at::Tensor& x, int64_t dim, std::optional<double> scale,
                  bool causal, const std::optional<at::Tensor>& mask) {
  const SoftmaxPlan p = check_softmax_args(x, dim, scale, causal, mask);
  const c10::cuda::CUDAGuard guard(x.device());
  if (x.numel() == 0) return;
  check_launch(kernels::softmax_forward_cuda(
      scalar_kind(x.scalar_type()), x.data_ptr(), p.outer, p.n, p.inner, p.scale,
      p.causal_rows, p.mask, at::cuda::getCurrentCUDAStream().stream()), "softmax_");
}

at::Tensor softmax_backward_cuda(const at::Tensor& grad_output, const at::Tensor& output,
                                 int64_t dim, double scale) {
  const SoftmaxPlan p = check_softmax_backward_args(grad_output, output, dim, scale);
  const c10::cuda::CUDAGuard guard(output.device());
  at::Tensor grad_input = at::empty_like(output);
  if (output.numel() == 0) return grad_input;
  check_launch(kernels::softmax_backward_cuda(
      scalar_kind(output.scalar_type()), grad_output.const_data_ptr(),
      output.const_data_ptr(), grad_input.data_ptr(), p.outer, p.n, p.inner, p.scale,
      at::cuda::getCurrentCUDAStream().stream()), "softmax_backward");
  return grad_input;
}

void softmax_backward_inplace_cuda(const at::Tensor& grad, const at::Tensor& output,
                                   int64_t dim, double scale) {
  const SoftmaxPlan p = check_softmax_backward_args(grad, output, dim, scale, "grad", "softmax_backward_");
  check_no_overlap("softmax_backward_", grad, "grad", output, "output");
  const c10::cuda::CUDAGuard guard(output.device());
  if (output.numel() == 0) return;
  check_launch(kernels::softmax_backward_cuda(
      scalar_kind(output.scalar_type()), grad.const_data_ptr(), output.const_data_ptr(),
      grad.data_ptr(), p.outer, p.n, p.inner, p.scale,
      at::cuda::getCurrentCUDAStream().stream()), "softmax_backward_");
}

}  // namespace

TORCH_LIBRARY_IMPL(make_inplace, CUDA, m) {
  m.impl("softmax_", &softmax_cuda);
  m.impl("softmax_backward", &softmax_backward_cuda);
  m.impl("softmax_backward_", &softmax_backward_inplace_cuda);
}

}  // namespace make_inplace
