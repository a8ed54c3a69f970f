// outer_product(_backward) on the CPU: checks, then the torch-free kernel on
// (batch, ...) views of the inputs.
#include <torch/library.h>

#include "make_inplace/outer_product.h"
#include "make_inplace/torch_kinds.h"

namespace make_inplace {
namespace {

void outer_product_forward_cpu(const at::Tensor& a, const at::Tensor& b,
                               const at::Tensor& out) {
  const OuterShape s = check_outer_forward_args(a, b, out);
  if (s.batch == 0 || s.n == 0 || s.m == 0) return;
  at::Tensor a2, b2;
  TORCH_CHECK(kernels::outer_product_forward_cpu(
                  scalar_kind(a.scalar_type()), outer_input(a, {s.batch, s.n}, a2),
                  outer_input(b, {s.batch, s.m}, b2), out.data_ptr(), s.batch,
                  s.n, s.m) == 0,
              "make_inplace.outer_product: unsupported dtype ", a.scalar_type());
}

void outer_product_backward_cpu(const at::Tensor& grad_out, const at::Tensor& a,
                                const at::Tensor& b, bool accumulate,
                                const std::optional<at::Tensor>& grad_a,
                                const std::optional<at::Tensor>& grad_b) {
  const OuterShape s = check_outer_backward_args(grad_out, a, b, grad_a, grad_b);
  const bool want_a = grad_a.has_value() && grad_a->defined();
  const bool want_b = grad_b.has_value() && grad_b->defined();
  if (s.batch == 0 || (!want_a && !want_b)) return;
  at::Tensor g2, a2, b2;
  TORCH_CHECK(
      kernels::outer_product_backward_cpu(
          scalar_kind(a.scalar_type()),
          outer_input(grad_out, {s.batch, s.n, s.m}, g2),
          outer_input(a, {s.batch, s.n}, a2), outer_input(b, {s.batch, s.m}, b2),
          want_a ? grad_a->data_ptr() : nullptr,
          want_b ? grad_b->data_ptr() : nullptr, s.batch, s.n, s.m,
          accumulate) == 0,
      "make_inplace.outer_product_backward: unsupported dtype ", a.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(make_inplace, CPU, m) {
  m.impl("outer_product", &outer_product_forward_cpu);
  m.impl("outer_product_backward", &outer_product_backward_cpu);
}

}  // namespace make_inplace
