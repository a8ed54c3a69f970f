#pragma once
// square_matmul_: the argument checks and the routing policy's view of a
// call, shared by the CPU and CUDA bindings so both honour the same memory
// bound.
#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <cstdint>
#include <optional>

#include "make_inplace/checks.h"
#include "make_inplace/square_matmul_route.h"
#include "make_inplace/torch_kinds.h"

namespace make_inplace {

// The weight as the kernels read it: a row-major n x n matrix and whether the
// product uses it transposed. A weight given as the transpose of a contiguous
// matrix (weight.T of an nn.Linear weight, say) is read in place, not copied.
struct SquareWeight {
  at::Tensor matrix;  // contiguous
  bool transpose;
};

inline SquareWeight check_square_matmul_args(
    const at::Tensor& x, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, bool transpose,
    std::optional<int64_t> workspace_bytes) {
  constexpr const char* op = "square_matmul_";
  MAKE_INPLACE_CHECK(op, x.dim() >= 1,
              "x must have at least one dimension (..., n), got a 0-dim tensor");
  check_float_dtype(op, x, "x");
  const int64_t n = x.size(-1);
  MAKE_INPLACE_CHECK(op, n >= 1, "x's last dimension n must be at least 1, got shape ",
              x.sizes());
  MAKE_INPLACE_CHECK(op, weight.dim() == 2 && weight.size(0) == n && weight.size(1) == n,
              "weight must have shape (", n, ", ", n,
              ") to match x's last dimension, got ", weight.sizes());
  check_same_dtype(op, weight, "weight", x, "x");
  check_same_device(op, weight, "weight", x, "x");
  check_contiguous(op, x, "x",
                   "the result is written into x's own memory, so a copy "
                   "would not reach the caller");
  check_no_overlap(op, x, "x", weight, "weight");
  if (bias.has_value() && bias->defined()) {
    MAKE_INPLACE_CHECK(op, bias->dim() == 1 && bias->size(0) == n,
                "bias must have shape (", n, "), got ", bias->sizes());
    check_same_dtype(op, *bias, "bias", x, "x");
    check_same_device(op, *bias, "bias", x, "x");
    MAKE_INPLACE_CHECK(op, bias->stride(0) == 1 || n == 1,
                "bias must be contiguous, got stride ", bias->stride(0));
    check_no_overlap(op, x, "x", *bias, "bias");
  }
  MAKE_INPLACE_CHECK(op, !workspace_bytes.has_value() || *workspace_bytes >= 0,
              "workspace_bytes must be None or >= 0, got ",
              workspace_bytes.value_or(0));
  if (weight.is_contiguous()) return {weight, transpose};
  if (weight.t().is_contiguous()) return {weight.t(), !transpose};
  MAKE_INPLACE_CHECK(op, false,
              "weight must be contiguous or the transpose of a contiguous "
              "matrix (it is read in place, never copied), got strides ",
              weight.strides());
}

// The call as the routing policy sees it (after check_square_matmul_args).
inline square_matmul::Call square_matmul_call(const at::Tensor& x, const SquareWeight& w,
                                              const std::optional<at::Tensor>& bias,
                                              std::optional<int64_t> workspace_bytes) {
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  square_matmul::Call c;
  c.n = x.size(-1);
  c.rows = x.numel() / c.n;
  c.kind = scalar_kind(x.scalar_type());
  c.transpose = w.transpose;
  c.x_aligned16 = aligned16(x.const_data_ptr());
  c.w_aligned16 = aligned16(w.matrix.const_data_ptr());
  c.bias_aligned16 = !(bias.has_value() && bias->defined()) || aligned16(bias->const_data_ptr());
  c.workspace_bound = square_matmul::workspace_bound(static_cast<int64_t>(x.nbytes()), workspace_bytes);
  c.allow_tf32 = x.is_cuda() && at::globalContext().allowTF32CuBLAS();  // a locked lookup: not for CPU calls
  return c;
}

}  // namespace make_inplace
