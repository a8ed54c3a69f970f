#pragma once
// outer_product(_backward): argument checks shared by the CPU and CUDA
// bindings, and the (batch, ...) views the kernels take. Every check runs
// before anything is written.
#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "make_inplace/checks.h"
#include "make_inplace/kernels/outer_product.h"

namespace make_inplace {

// The leading ("...") dimensions flattened into one batch dimension.
struct OuterShape {
  std::vector<int64_t> lead;
  int64_t batch = 1, n = 0, m = 0;
};

// A view of t with its leading dims merged into one batch dim, read as it is
// when its strides allow (reshape copies only when they do not).
inline kernels::OuterInput outer_input(const at::Tensor& t, at::IntArrayRef shape,
                                       at::Tensor& holder) {
  holder = t.reshape(shape);
  kernels::OuterInput in{holder.const_data_ptr(), {0, 0, 0}};
  for (int64_t d = 0; d < holder.dim(); ++d) in.stride[d] = holder.stride(d);
  return in;
}

inline OuterShape check_outer_inputs(const char* op, const at::Tensor& a, const at::Tensor& b) {
  MAKE_INPLACE_CHECK(op, a.dim() >= 1, "a must have shape (..., n), got a 0-dim tensor");
  MAKE_INPLACE_CHECK(op, b.dim() >= 1, "b must have shape (..., m), got a 0-dim tensor");
  check_float_dtype(op, a, "a");
  check_same_dtype(op, b, "b", a, "a");
  check_same_device(op, b, "b", a, "a");
  MAKE_INPLACE_CHECK(op, a.sizes().slice(0, a.dim() - 1) == b.sizes().slice(0, b.dim() - 1),
              "b's leading dimensions must equal a's (a ", a.sizes(), ", b ",
              b.sizes(), ")");
  OuterShape s;
  s.lead = a.sizes().slice(0, a.dim() - 1).vec();
  for (int64_t d : s.lead) s.batch *= d;
  s.n = a.size(-1);
  s.m = b.size(-1);
  return s;
}

inline std::vector<int64_t> outer_result_shape(const OuterShape& s) {
  std::vector<int64_t> shape = s.lead;
  shape.push_back(s.n);
  shape.push_back(s.m);
  return shape;
}

inline void check_outer_buffer(const char* op, const at::Tensor& buf, const char* name,
                               at::IntArrayRef shape, const at::Tensor& a) {
  MAKE_INPLACE_CHECK(op, buf.sizes() == shape, name, " must have shape ", shape, ", got ",
              buf.sizes());
  check_same_dtype(op, buf, name, a, "a");
  check_same_device(op, buf, name, a, "a");
  check_contiguous(op, buf, name, "the kernel writes it densely");
}

inline OuterShape check_outer_forward_args(const at::Tensor& a,
                                           const at::Tensor& b,
                                           const at::Tensor& out) {
  constexpr const char* op = "outer_product";
  OuterShape s = check_outer_inputs(op, a, b);
  check_outer_buffer(op, out, "out", outer_result_shape(s), a);
  check_no_overlap(op, out, "out", a, "a");
  check_no_overlap(op, out, "out", b, "b");
  return s;
}

inline OuterShape check_outer_backward_args(
    const at::Tensor& grad_out, const at::Tensor& a, const at::Tensor& b,
    const std::optional<at::Tensor>& grad_a,
    const std::optional<at::Tensor>& grad_b) {
  constexpr const char* op = "outer_product_backward";
  OuterShape s = check_outer_inputs(op, a, b);
  MAKE_INPLACE_CHECK(op, grad_out.sizes() == at::IntArrayRef(outer_result_shape(s)),
              "grad_out must have shape ", at::IntArrayRef(outer_result_shape(s)),
              " (a's leading dims, n, m), got ", grad_out.sizes());
  check_same_dtype(op, grad_out, "grad_out", a, "a");
  check_same_device(op, grad_out, "grad_out", a, "a");
  const at::Tensor* inputs[] = {&grad_out, &a, &b};
  const char* names[] = {"grad_out", "a", "b"};
  if (grad_a.has_value() && grad_a->defined()) {
    check_outer_buffer(op, *grad_a, "grad_a", a.sizes(), a);
    for (int k = 0; k < 3; ++k) check_no_overlap(op, *grad_a, "grad_a", *inputs[k], names[k]);
  }
  if (grad_b.has_value() && grad_b->defined()) {
    check_outer_buffer(op, *grad_b, "grad_b", b.sizes(), a);
    for (int k = 0; k < 3; ++k) check_no_overlap(op, *grad_b, "grad_b", *inputs[k], names[k]);
    if (grad_a.has_value() && grad_a->defined()) {
      check_no_overlap(op, *grad_a, "grad_a", *grad_b, "grad_b");
    }
  }
  return s;
}

}  // namespace make_inplace
