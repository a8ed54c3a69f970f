#pragma once
// trilinear_interpolation(_backward): argument checks shared by the CPU and
// CUDA bindings, and the strided views the kernels take. Every check runs
// before anything is written.
#include <ATen/ATen.h>

#include <optional>

#include "make_inplace/checks.h"
#include "make_inplace/kernels/trilinear.h"

namespace make_inplace {

inline kernels::TrilinearInput trilinear_input(const at::Tensor& t) {
  kernels::TrilinearInput in{t.const_data_ptr(), {0, 0, 0}};
  for (int64_t d = 0; d < t.dim(); ++d) in.stride[d] = t.stride(d);
  return in;
}

inline void check_points(const char* op, const at::Tensor& points, int64_t n) {
  MAKE_INPLACE_CHECK(op, points.dim() == 2 && points.size(1) == 3,
              "points must have shape (N, 3), got ", points.sizes());
  MAKE_INPLACE_CHECK(op, points.size(0) == n, "points must have N = ", n,
              " rows to match the other arguments, got shape ",
              points.sizes());
}

inline void check_feats(const char* op, const at::Tensor& feats, const char* name) {
  MAKE_INPLACE_CHECK(op, feats.dim() == 3, name, " must have shape (N, 8, F), got ",
              feats.sizes());
  MAKE_INPLACE_CHECK(op, feats.size(1) == 8, name,
              " must hold the 8 corners of each cell in dimension 1 "
              "(shape (N, 8, F)), got ",
              feats.size(1), " corners (shape ", feats.sizes(), ")");
}

// A caller buffer: exact shape, dtype and device of `like`'s, contiguous.
inline void check_buffer(const char* op, const at::Tensor& buf, const char* name,
                         at::IntArrayRef shape, const at::Tensor& like,
                         const char* like_name) {
  MAKE_INPLACE_CHECK(op, buf.sizes() == shape, name, " must have shape ", shape,
              ", got ", buf.sizes());
  check_same_dtype(op, buf, name, like, like_name);
  check_same_device(op, buf, name, like, like_name);
  check_contiguous(op, buf, name, "the kernel writes it densely");
}

inline void check_trilinear_forward_args(const at::Tensor& feats,
                                         const at::Tensor& points,
                                         const at::Tensor& out) {
  constexpr const char* op = "trilinear_interpolation";
  check_feats(op, feats, "feats");
  check_float_dtype(op, feats, "feats");
  const int64_t n = feats.size(0), f = feats.size(2);
  check_points(op, points, n);
  check_same_dtype(op, points, "points", feats, "feats");
  check_same_device(op, points, "points", feats, "feats");
  check_buffer(op, out, "out", {n, f}, feats, "feats");
  check_no_overlap(op, out, "out", feats, "feats");
  check_no_overlap(op, out, "out", points, "points");
}

inline void check_trilinear_backward_args(
    const at::Tensor& grad_out, const at::Tensor& points,
    const std::optional<at::Tensor>& feats, const at::Tensor& grad_feats,
    const std::optional<at::Tensor>& grad_points) {
  constexpr const char* op = "trilinear_interpolation_backward";
  MAKE_INPLACE_CHECK(op, grad_out.dim() == 2, "grad_out must have shape (N, F), got ",
              grad_out.sizes());
  check_float_dtype(op, grad_out, "grad_out");
  const int64_t n = grad_out.size(0), f = grad_out.size(1);
  check_points(op, points, n);
  check_same_dtype(op, points, "points", grad_out, "grad_out");
  check_same_device(op, points, "points", grad_out, "grad_out");
  const bool has_feats = feats.has_value() && feats->defined();
  const bool has_grad_points = grad_points.has_value() && grad_points->defined();
  if (has_feats) {
    check_feats(op, *feats, "feats");
    MAKE_INPLACE_CHECK(op, feats->size(0) == n && feats->size(2) == f,
                "feats must have shape (", n, ", 8, ", f,
                ") to match grad_out ", grad_out.sizes(), ", got ",
                feats->sizes());
    check_same_dtype(op, *feats, "feats", grad_out, "grad_out");
    check_same_device(op, *feats, "feats", grad_out, "grad_out");
  }
  MAKE_INPLACE_CHECK(op, !has_grad_points || has_feats,
              "grad_points needs feats: the points gradient goes through the "
              "corner features; pass feats or drop grad_points");
  check_buffer(op, grad_feats, "grad_feats", {n, 8, f}, grad_out, "grad_out");
  for (const auto& [t, name] :
       {std::pair<const at::Tensor*, const char*>{&grad_out, "grad_out"},
        {&points, "points"}}) {
    check_no_overlap(op, grad_feats, "grad_feats", *t, name);
    if (has_grad_points) check_no_overlap(op, *grad_points, "grad_points", *t, name);
  }
  if (has_feats) check_no_overlap(op, grad_feats, "grad_feats", *feats, "feats");
  if (has_grad_points) {
    check_buffer(op, *grad_points, "grad_points", {n, 3}, grad_out, "grad_out");
    check_no_overlap(op, *grad_points, "grad_points", *feats, "feats");
    check_no_overlap(op, grad_feats, "grad_feats", *grad_points, "grad_points");
  }
}

}  // namespace make_inplace
