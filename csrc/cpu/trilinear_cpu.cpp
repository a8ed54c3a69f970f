// trilinear_interpolation(_backward) on the CPU: checks, then the torch-free
// kernel reading the inputs through their strides (no copies).
#include <torch/library.h>

#include "make_inplace/torch_kinds.h"
#include "make_inplace/trilinear.h"

namespace make_inplace {
namespace {

void trilinear_forward_cpu(const at::Tensor& feats, const at::Tensor& points,
                           const at::Tensor& out) {
  check_trilinear_forward_args(feats, points, out);
  const int64_t n = feats.size(0), f = feats.size(2);
  if (n == 0 || f == 0) return;
  TORCH_CHECK(kernels::trilinear_forward_cpu(
                  scalar_kind(feats.scalar_type()), trilinear_input(feats),
                  trilinear_input(points), out.data_ptr(), n, f) == 0,
              "make_inplace.trilinear_interpolation: unsupported dtype ", feats.scalar_type());
}

void trilinear_backward_cpu(const at::Tensor& grad_out, const at::Tensor& points,
                            const std::optional<at::Tensor>& feats,
                            bool accumulate, const at::Tensor& grad_feats,
                            const std::optional<at::Tensor>& grad_points) {
  check_trilinear_backward_args(grad_out, points, feats, grad_feats, grad_points);
  const int64_t n = grad_out.size(0), f = grad_out.size(1);
  const bool with_points = grad_points.has_value() && grad_points->defined();
  if (n == 0) return;
  TORCH_CHECK(
      kernels::trilinear_backward_cpu(
          scalar_kind(grad_out.scalar_type()), trilinear_input(grad_out),
          trilinear_input(points),
          with_points ? trilinear_input(*feats) : kernels::TrilinearInput{},
          grad_feats.data_ptr(), with_points ? grad_points->data_ptr() : nullptr,
          n, f, accumulate) == 0,
      "make_inplace.trilinear_interpolation_backward: unsupported dtype ",
      grad_out.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(make_inplace, CPU, m) {
  m.impl("trilinear_interpolation", &trilinear_forward_cpu);
  m.impl("trilinear_interpolation_backward", &trilinear_backward_cpu);
}

}  // namespace make_inplace
