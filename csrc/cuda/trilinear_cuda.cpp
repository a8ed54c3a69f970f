// trilinear_interpolation(_backward) on CUDA: checks, then the torch-free
// kernels on the current stream under a device guard, reading the inputs
// through their strides (no copies, no allocation).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "make_inplace/launch_check.h"
#include "make_inplace/torch_kinds.h"
#include "make_inplace/trilinear.h"

namespace make_inplace {
namespace {

void trilinear_forward_cuda(const at::Tensor& feats, const at::Tensor& points,
                            const at::Tensor& out) {
  check_trilinear_forward_args(feats, points, out);
  const c10::cuda::CUDAGuard guard(feats.device());
  check_launch(kernels::trilinear_forward_cuda(
      scalar_kind(feats.scalar_type()), trilinear_input(feats),
      trilinear_input(points), out.data_ptr(), feats.size(0), feats.size(2),
      at::cuda::getCurrentCUDAStream().stream()), "trilinear_interpolation");
}

void trilinear_backward_cuda(const at::Tensor& grad_out, const at::Tensor& points,
                             const std::optional<at::Tensor>& feats,
                             bool accumulate, const at::Tensor& grad_feats,
                             const std::optional<at::Tensor>& grad_points) {
  check_trilinear_backward_args(grad_out, points, feats, grad_feats, grad_points);
  const bool with_points = grad_points.has_value() && grad_points->defined();
  const c10::cuda::CUDAGuard guard(grad_out.device());
  check_launch(kernels::trilinear_backward_cuda(
      scalar_kind(grad_out.scalar_type()), trilinear_input(grad_out),
      trilinear_input(points),
      with_points ? trilinear_input(*feats) : kernels::TrilinearInput{},
      grad_feats.data_ptr(), with_points ? grad_points->data_ptr() : nullptr,
      grad_out.size(0), grad_out.size(1), accumulate,
      at::cuda::getCurrentCUDAStream().stream()), "trilinear_interpolation_backward");
}

}  // namespace

TORCH_LIBRARY_IMPL(make_inplace, CUDA, m) {
  m.impl("trilinear_interpolation", &trilinear_forward_cuda);
  m.impl("trilinear_interpolation_backward", &trilinear_backward_cuda);
}

}  // namespace make_inplace
