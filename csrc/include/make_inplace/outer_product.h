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

inline OuterShape check_outer_inputs(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() >= 1, "a must have shape (..., n), got a 0-dim tensor");
  TORCH_CHECK(b.dim() >= 1, "b must have shape (..., m), got a 0-dim tensor");
  check_float_dtype(a, "a");
  check_same_dtype(b, "b", a, "a");
  check_same_device(b, "b", a, "a");
  TORCH_CHECK(a.sizes().slice(0, a.dim() - 1) == b.sizes().slice(0, b.dim() - 1),
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

inline void check_outer_buffer(const at::Tensor& buf, const char* name,
                               at::IntArrayRef shape, const at::Tensor& a) {
  TORCH_CHECK(buf.sizes() == shape, name, " must have shape ", shape, ", got ",
              buf.sizes());
  check_same_dtype(buf, name, a, "a");
  check_same_device(buf, name, a, "a");
  check_contiguous(buf, name, "the kernel writes it densely");
}

inline OuterShape check_outer_forward_args(const at::Tensor& a,
                                           const at::Tensor& b,
                                           const at::Tensor& out) {
  OuterShape s = check_outer_inputs(a, b);
  check_outer_buffer(out, "out", outer_result_shape(s), a);
  check_no_overlap(out, "out", a, "a");
  check_no_overlap(out, "out", b, "b");
  return s;
}

inline OuterShape check_outer_backward_args(
    const at::Tensor& grad_out, const at::Tensor& a, const at::Tensor& b,
    const std::optional<at::Tensor>& grad_a,
    const std::optional<at::Tensor>& grad_b) {
  OuterShape s = check_outer_inputs(a, b);
  TORCH_CHECK(grad_out.sizes() == at::IntArrayRef(outer_result_shape(s)),
              "grad_out must have shape ", at::IntArrayRef(outer_result_shape(s)),
              " (a's leading dims, n, m), got ", grad_out.sizes());
  check_same_dtype(grad_out, "grad_out", a, "a");
  check_same_device(grad_out, "grad_out", a, "a");
  const at::Tensor* inputs[] = {&grad_out, &a, &b};
  const char* names[] = {"grad_out", "a", "b"};
  if (grad_a.has_value() && grad_a->defined()) {
    check_outer_buffer(*grad_a, "grad_a", a.sizes(), a);
    for (int k = 0; k < 3; ++k) check_no_overlap(*grad_a, "grad_a", *inputs[k], names[k]);
  }
  if (grad_b.has_value() && grad_b->defined()) {
    check_outer_buffer(*grad_b, "grad_b", b.sizes(), a);
    for (int k = 0; k < 3; ++k) check_no_overlap(*grad_b, "grad_b", *inputs[k], names[k]);
    if (grad_a.has_value() && grad_a->defined()) {
      check_no_overlap(*grad_a, "grad_a", *grad_b, "grad_b");
    }
  }
  return s;
}

}  // namespace make_inplace
