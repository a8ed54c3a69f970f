// softmax_ / softmax_backward on the CPU: checks, then the torch-free kernel.
#include <torch/library.h>

#include "make_inplace/softmax.h"
#include "make_inplace/torch_kinds.h"

namespace make_inplace {
namespace {

void softmax_cpu(const at::Tensor& x, int64_t dim, std::optional<double> scale,
                 bool causal, const std::optional<at::Tensor>& mask) {
  const SoftmaxPlan p = check_softmax_args(x, dim, scale, causal, mask);
  if (x.numel() == 0) return;
  kernels::softmax_forward_cpu(scalar_kind(x.scalar_type()), x.data_ptr(), p.outer,
                               p.n, p.inner, p.scale, p.causal_rows, p.mask);
}

at::Tensor softmax_backward_cpu(const at::Tensor& grad_output,
                                const at::Tensor& output, int64_t dim,
                                double scale) {
  const SoftmaxPlan p = check_softmax_backward_args(grad_output, output, dim, scale);
  at::Tensor grad_input = at::empty_like(output);
  if (output.numel() == 0) return grad_input;
  kernels::softmax_backward_cpu(scalar_kind(output.scalar_type()),
                                grad_output.const_data_ptr(), output.const_data_ptr(),
                                grad_input.data_ptr(), p.outer, p.n, p.inner, p.scale);
  return grad_input;
}

void softmax_backward_inplace_cpu(const at::Tensor& grad, const at::Tensor& output,
                                  int64_t dim, double scale) {
  const SoftmaxPlan p = check_softmax_backward_args(grad, output, dim, scale, "grad", "softmax_backward_");
  check_no_overlap("softmax_backward_", grad, "grad", output, "output");
  if (output.numel() == 0) return;
  kernels::softmax_backward_cpu(scalar_kind(output.scalar_type()), grad.const_data_ptr(),
                                output.const_data_ptr(), grad.data_ptr(), p.outer, p.n,
                                p.inner, p.scale);
}

}  // namespace

TORCH_LIBRARY_IMPL(make_inplace, CPU, m) {
  m.impl("softmax_", &softmax_cpu);
  m.impl("softmax_backward", &softmax_backward_cpu);
  m.impl("softmax_backward_", &softmax_backward_inplace_cpu);
}

}  // namespace make_inplace
