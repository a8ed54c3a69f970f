#pragma once
// square_matmul_: the argument checks and the workspace plan, shared by the
// CPU and CUDA kernels so both honour the same memory bound.
#include <ATen/ATen.h>

#include <optional>

#include "make_inplace/checks.h"

namespace make_inplace {

// Default workspace bound: at most 1/16 of x and at most 64 MiB.
constexpr int64_t kDefaultWorkspaceCap = int64_t{64} << 20;
constexpr int64_t kDefaultWorkspaceFraction = 16;

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
  TORCH_CHECK(x.dim() >= 1,
              "x must have at least one dimension (..., n), got a 0-dim tensor");
  check_float_dtype(x, "x");
  const int64_t n = x.size(-1);
  TORCH_CHECK(n >= 1, "x's last dimension n must be at least 1, got shape ",
              x.sizes());
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) == n && weight.size(1) == n,
              "weight must have shape (", n, ", ", n,
              ") to match x's last dimension, got ", weight.sizes());
  check_same_dtype(weight, "weight", x, "x");
  check_same_device(weight, "weight", x, "x");
  check_contiguous(x, "x",
                   "the result is written into x's own memory, so a copy "
                   "would not reach the caller");
  check_no_overlap(x, "x", weight, "weight");
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n,
                "bias must have shape (", n, "), got ", bias->sizes());
    check_same_dtype(*bias, "bias", x, "x");
    check_same_device(*bias, "bias", x, "x");
    TORCH_CHECK(bias->stride(0) == 1 || n == 1,
                "bias must be contiguous, got stride ", bias->stride(0));
    check_no_overlap(x, "x", *bias, "bias");
  }
  TORCH_CHECK(!workspace_bytes.has_value() || *workspace_bytes >= 0,
              "workspace_bytes must be None or >= 0, got ",
              workspace_bytes.value_or(0));
  if (weight.is_contiguous()) return {weight, transpose};
  if (weight.t().is_contiguous()) return {weight.t(), !transpose};
  TORCH_CHECK(false,
              "weight must be contiguous or the transpose of a contiguous "
              "matrix (it is read in place, never copied), got strides ",
              weight.strides());
}

// The bound on extra memory for this call, in bytes.
inline int64_t workspace_bound(const at::Tensor& x,
                               std::optional<int64_t> workspace_bytes) {
  if (workspace_bytes.has_value()) return *workspace_bytes;
  return std::min(kDefaultWorkspaceCap,
                  static_cast<int64_t>(x.nbytes()) / kDefaultWorkspaceFraction);
}

}  // namespace make_inplace
