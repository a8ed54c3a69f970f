#pragma once
// Per-op argument checks of the MindSpore bridge, shared by the CPU and CUDA
// entry points: each parses a Call into the raw pointers and sizes its kernel
// takes, or fails with a message before anything is written.
#include "bridge.h"

namespace make_inplace::mindspore {

// Square matmul: inputs x (..., n), weight (n, n) [, bias (n,)]; output y with
// x's shape. y = x @ weight (+ bias), or x @ weight^T.
struct SquareMatmulArgs {
  ScalarKind kind;
  const void* x;
  const void* weight;
  const void* bias;  // null without bias
  void* y;
  int64_t rows;
  int64_t n;
};

inline int parse_square_matmul(const Call& c, bool has_bias, SquareMatmulArgs* a) {
  const int nin = has_bias ? 3 : 2;
  if (int rc = check_nparam(c, nin + 1)) return rc;
  const Tensor x = c.arg(0), w = c.arg(1), y = c.arg(nin);
  if (int rc = float_kind(c, 0, "x", &a->kind)) return rc;
  if (x.ndim < 1) return fail(kBadArgs, c.op, "x must have at least one dimension (..., n), got a 0-dim tensor");
  const int64_t n = x.size(-1);
  if (n < 1) return fail(kBadArgs, c.op, "x's last dimension n must be at least 1, got shape %s", ShapeText(x).text);
  if (w.ndim != 2 || w.shape[0] != n || w.shape[1] != n) {
    return fail(kBadArgs, c.op, "weight must have shape (%lld, %lld) to match x's last dimension, got %s",
                static_cast<long long>(n), static_cast<long long>(n), ShapeText(w).text);
  }
  if (int rc = check_dtype(c, 1, "weight", a->kind, "x")) return rc;
  if (has_bias) {
    const Tensor b = c.arg(2);
    if (b.ndim != 1 || b.shape[0] != n) {
      return fail(kBadArgs, c.op, "bias must have shape (%lld,), got %s", static_cast<long long>(n),
                  ShapeText(b).text);
    }
    if (int rc = check_dtype(c, 2, "bias", a->kind, "x")) return rc;
  }
  if (int rc = check_dtype(c, nin, "output", a->kind, "x")) return rc;
  if (int rc = check_same_shape(c, nin, "output", 0, "x")) return rc;
  a->x = x.data;
  a->weight = w.data;
  a->bias = has_bias ? c.arg(2).data : nullptr;
  a->y = y.data;
  a->n = n;
  a->rows = x.numel() / n;
  return kOk;
}

}  // namespace make_inplace::mindspore
